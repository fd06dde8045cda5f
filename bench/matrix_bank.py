"""The numpy memory bank a competent Python user writes, the baseline of bench.episodes: the pickle
and deep-copy snapshots are taken of it, at its best."""
import numpy as np

from memr1.bench.memory_impls import DIM

SPEAKERS = ("Caroline", "Melanie")


class MatrixBank:
    """What a competent Python user writes: per speaker, the unit float32 vectors of its live memories
    packed in one matrix (capacity doubling) beside their ids; id -> (speaker, row, text). A search is
    one matvec over the speaker's rows + argpartition, exact; a DELETE moves the speaker's last row into
    the hole, so no search scans dead rows or the other speaker's."""

    def __init__(self):
        self.m = {s: np.empty((0, DIM), np.float32) for s in SPEAKERS}
        self.ids = {s: np.empty(0, np.int64) for s in SPEAKERS}
        self.n, self.next_id = dict.fromkeys(SPEAKERS, 0), 0
        self.mem: dict[int, tuple[str, int, str]] = {}

    def apply(self, op: tuple):
        kind, mid, vec, text, speaker = op
        if kind == "none":
            return None
        if kind == "add":
            mid, row = self.next_id, self.n[speaker]
            if row == len(self.m[speaker]):
                self._grow(speaker)
            self.ids[speaker][row] = mid
            self.n[speaker], self.next_id = row + 1, mid + 1
        elif kind == "update":
            speaker, row, _ = self.mem[mid]
        else:
            speaker, row, _ = self.mem.pop(mid)
            last = self.n[speaker] = self.n[speaker] - 1
            if row != last:   # the last row fills the hole
                moved = int(self.ids[speaker][last])
                self.m[speaker][row], self.ids[speaker][row] = self.m[speaker][last], moved
                self.mem[moved] = (speaker, row, self.mem[moved][2])
            return mid
        self.m[speaker][row] = vec
        self.mem[mid] = (speaker, row, text)
        return mid

    def _grow(self, speaker: str) -> None:
        n, cap = self.n[speaker], max(16, 2 * len(self.m[speaker]))
        m, ids = np.empty((cap, DIM), np.float32), np.empty(cap, np.int64)
        m[:n], ids[:n] = self.m[speaker][:n], self.ids[speaker][:n]
        self.m[speaker], self.ids[speaker] = m, ids

    def search(self, q: np.ndarray, k: int, speaker: str) -> tuple[np.ndarray, np.ndarray]:
        n = self.n[speaker]
        k = min(k, n)
        if k == 0:
            return np.empty(0, np.int64), np.empty(0, np.float32)
        s = self.m[speaker][:n] @ q
        top = np.argpartition(-s, k - 1)[:k] if k < n else np.arange(n)
        top = top[np.argsort(-s[top], kind="stable")]
        return self.ids[speaker][top], s[top]

    def __len__(self) -> int:
        return len(self.mem)

    def __getstate__(self) -> dict:  # the used rows only: pickle writes no spare capacity
        n = self.n
        return {"m": {s: a[:n[s]] for s, a in self.m.items()}, "ids": {s: a[:n[s]] for s, a in self.ids.items()},
                "n": n, "mem": self.mem, "next_id": self.next_id}

    def __setstate__(self, st: dict) -> None:  # capacity = rows; the next ADD doubles it
        self.__dict__.update(st)

    def __deepcopy__(self, memo) -> "MatrixBank":
        """A deep copy at its best: the used rows of each array (capacity kept, unwritten), the dict copied
        shallowly (its values are tuples of str and int, immutable), no generic per-object walk."""
        c = MatrixBank.__new__(MatrixBank)
        c.m, c.ids = {}, {}
        for s, n in self.n.items():
            c.m[s], c.ids[s] = np.empty_like(self.m[s]), np.empty_like(self.ids[s])
            c.m[s][:n], c.ids[s][:n] = self.m[s][:n], self.ids[s][:n]
        c.n, c.mem, c.next_id = dict(self.n), dict(self.mem), self.next_id
        return c


_SPK = {s: i for i, s in enumerate(SPEAKERS)}


class _Base:
    """Rows frozen at a fold, shared by the bank that folded and every snapshot made after: never written.
    Per speaker, the unit vectors and ids packed (row order); by id, `code` = 2 * row + speaker (-1: not
    here) and the text."""
    __slots__ = ("m", "ids", "code", "texts", "n")

    def __init__(self, m, ids, code, texts):
        self.m, self.ids, self.code, self.texts = m, ids, code, texts
        self.n = sum(len(i) for i in ids)


_EMPTY = _Base(tuple(np.empty((0, DIM), np.float32) for _ in SPEAKERS), tuple(np.empty(0, np.int64) for _ in SPEAKERS),
               np.empty(0, np.int64), [])


class CowBank:
    """The copy-on-write numpy bank, what a competent user writes once deep copies cost too much: a
    shared, frozen `_Base` (never copied) plus this bank's own overlay, namely the rows it appended
    (per speaker, packed, capacity doubling; an UPDATE appends its new row) and its tombstones (the
    base ids it deleted or superseded, and their rows per speaker). A search scores the speaker's base
    rows and overlay rows exactly (two matvecs), tombstoned rows masked, then argpartition.
    snapshot() copies the overlay's rows in use and shares the base; once the overlay holds more than
    FOLD_FRAC of the base (and FOLD_MIN rows), the snapshot first folds it into a new base, so a
    snapshot never copies more than that fraction of the bank and the folds, which only snapshots need,
    are timed as snapshot cost. Older snapshots keep the old base alive."""
    FOLD_MIN, FOLD_FRAC = 16, 0.5   # of the fractions 1/8 to 2, the one copying fewest rows per snapshot here

    def __init__(self):
        self.base, self.next_id = _EMPTY, 0
        self.m = [np.empty((16, DIM), np.float32) for _ in SPEAKERS]   # overlay rows, per speaker
        self.ids = [np.empty(16, np.int64) for _ in SPEAKERS]
        self.n = [0] * len(SPEAKERS)
        self.mem: dict[int, tuple[int, int, str]] = {}   # overlay id -> (speaker, overlay row, text)
        self.gone: set[int] = set()                        # base ids deleted or superseded here
        self.dead: list[list[int]] = [[] for _ in SPEAKERS]   # their base rows, per speaker
        self.cat: list = [None] * len(SPEAKERS)   # base + overlay ids per speaker, kept while no row moves

    def _append(self, s: int, mid: int, vec, text: str) -> None:
        row = self.n[s]
        if row == len(self.ids[s]):
            cap = max(16, 2 * row)
            m, ids = np.empty((cap, DIM), np.float32), np.empty(cap, np.int64)
            m[:row], ids[:row] = self.m[s][:row], self.ids[s][:row]
            self.m[s], self.ids[s] = m, ids
        self.m[s][row], self.ids[s][row] = vec, mid
        self.n[s], self.cat[s] = row + 1, None
        self.mem[mid] = (s, row, text)

    def apply(self, op: tuple):
        kind, mid, vec, text, speaker = op
        if kind == "none":
            return None
        if kind == "add":
            mid = self.next_id
            self.next_id = mid + 1
            self._append(_SPK[speaker], mid, vec, text)
            return mid
        hit = self.mem.get(mid)
        if hit is not None:   # an overlay row: this bank's own, written in place
            s, row, _ = hit
            if kind == "update":
                self.m[s][row] = vec
                self.mem[mid] = (s, row, text)
                return mid
            del self.mem[mid]
            last = self.n[s] = self.n[s] - 1
            self.cat[s] = None
            if row != last:   # the last overlay row fills the hole
                moved = int(self.ids[s][last])
                self.m[s][row], self.ids[s][row] = self.m[s][last], moved
                self.mem[moved] = (s, row, self.mem[moved][2])
            return mid
        code = int(self.base.code[mid]) if 0 <= mid < len(self.base.code) else -1
        if code < 0 or mid in self.gone:
            raise KeyError(mid)
        s = code & 1
        self.gone.add(mid)
        self.dead[s].append(code >> 1)
        if kind == "update":
            self._append(s, mid, vec, text)
        return mid

    def search(self, q: np.ndarray, k: int, speaker: str) -> tuple[np.ndarray, np.ndarray]:
        s = _SPK[speaker]
        base, n, dead = self.base, self.n[s], self.dead[s]
        if len(base.ids[s]):
            sc, ids = base.m[s] @ q, base.ids[s]
            if dead:
                sc[dead] = -np.inf
            if n:
                sc, ids = np.concatenate([sc, self.m[s][:n] @ q]), self.cat[s]
                if ids is None:
                    ids = self.cat[s] = np.concatenate([base.ids[s], self.ids[s][:n]])
        else:
            sc, ids = self.m[s][:n] @ q, self.ids[s][:n]
        k = min(k, len(sc) - len(dead))
        if k <= 0:
            return np.empty(0, np.int64), np.empty(0, np.float32)
        top = np.argpartition(-sc, k - 1)[:k] if k < len(sc) else np.arange(k)
        top = top[np.argsort(-sc[top], kind="stable")]
        return ids[top], sc[top]

    def __len__(self) -> int:
        return self.base.n - len(self.gone) + len(self.mem)

    def text(self, mid: int) -> str:
        hit = self.mem.get(mid)
        if hit is not None:
            return hit[2]
        if mid in self.gone or not 0 <= mid < len(self.base.code) or self.base.code[mid] < 0:
            raise KeyError(mid)
        return self.base.texts[mid]

    def fold(self) -> None:
        """The live base rows and the overlay as a new base (the old one stays as it was, for the
        snapshots that share it); the overlay empties."""
        old, m, ids = self.base, [], []
        for s, dead in enumerate(self.dead):
            bm, bi, n = old.m[s], old.ids[s], self.n[s]
            if dead:
                keep = np.ones(len(bi), bool)
                keep[dead] = False
                bm, bi = bm[keep], bi[keep]
            m.append(np.concatenate([bm, self.m[s][:n]]) if n else bm)
            ids.append(np.concatenate([bi, self.ids[s][:n]]) if n else bi)
        code = np.full(self.next_id, -1, np.int64)
        for s, i in enumerate(ids):
            code[i] = np.arange(s, 2 * len(i) + s, 2)
        texts = old.texts + [""] * (self.next_id - len(old.texts))
        for mid, (_, _, text) in self.mem.items():
            texts[mid] = text
        self.base = _Base(tuple(m), tuple(ids), code, texts)
        self.n = [0] * len(SPEAKERS)
        self.mem, self.gone, self.dead, self.cat = {}, set(), [[] for _ in SPEAKERS], [None] * len(SPEAKERS)

    def copy(self) -> "CowBank":
        """A bank with this one's state: the base shared, the overlay's rows in use copied."""
        c = CowBank.__new__(CowBank)
        c.base, c.next_id, c.n = self.base, self.next_id, list(self.n)
        c.m = [a[:n].copy() if n else a[:0] for a, n in zip(self.m, self.n)]   # no rows: nothing to write into
        c.ids = [a[:n].copy() if n else a[:0] for a, n in zip(self.ids, self.n)]
        c.mem, c.gone, c.dead = dict(self.mem), set(self.gone), [list(d) for d in self.dead]
        c.cat = list(self.cat)   # never written in place: shared
        return c

    def snapshot(self) -> "CowBank":
        """copy(), after folding an overlay past FOLD_FRAC of the base (the bank's content unchanged)."""
        if len(self.mem) + len(self.gone) > max(self.FOLD_MIN, self.FOLD_FRAC * self.base.n):
            self.fold()
        return self.copy()
