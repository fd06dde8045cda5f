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
