"""What bench.memory_ops puts memr1's bank against, the test vectors and the timing helpers.

The baselines are what a competent user would write:
- UsearchOverlay: one read-only usearch HNSW index shared by every rollout, plus a per-rollout overlay
  (added and updated vectors in a small matrix, the set of hidden base rows). Search asks the index for
  k * oversample candidates, drops hidden ones (asking again for twice as many when fewer than k are
  left), re-scores the survivors exactly in f32 and merges them with an exact scan of the overlay.
- NumpyBank: every vector, normalised, in one float32 matrix searched exactly by a matvec; a fork
  copies the matrix.
- A usearch.Index used directly as the bank (update = remove + add), for a bank that is never forked.
Ops are tuples (kind, id, vector) here; `as_memr1` turns them into the bank's own op structs.
"""
import time

import numpy as np
from usearch.index import Index

from memr1.bench.common import percentiles
from memr1.memory_store import Add, Delete, Noop, Update

DIM = 384
ADD, UPDATE, DELETE, NOOP = "add", "update", "delete", "noop"


def clustered(n: int, seed: int, latent: int = 24, clusters: int = 256) -> np.ndarray:
    """Points with low intrinsic dimension, like sentence embeddings: clusters in a 24-d latent space,
    projected to 384-d, plus noise. HNSW recall on independent random vectors says nothing about them."""
    shared = np.random.default_rng(1234)  # the same "embedding space" for every call
    projection = shared.standard_normal((latent, DIM)).astype(np.float32)
    centers = 2 * shared.standard_normal((clusters, latent)).astype(np.float32)
    rng = np.random.default_rng(seed)
    z = centers[rng.integers(0, clusters, n)] + rng.standard_normal((n, latent)).astype(np.float32)
    return z @ projection + 0.3 * rng.standard_normal((n, DIM)).astype(np.float32)


def unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def as_memr1(op: tuple):
    kind, mid, vec = op
    if kind == ADD:
        return Add("new memory", vec, "user", "t")
    if kind == UPDATE:
        return Update(mid, "updated memory", vec)
    return Delete(mid) if kind == DELETE else Noop()


def hnsw_index(config, keys: np.ndarray, vectors: np.ndarray) -> Index:
    """An index with the bank's own HNSW settings, so both sides search the same kind of graph."""
    index = Index(ndim=config.dim, metric="cos", dtype=config.hnsw_dtype, connectivity=config.hnsw_connectivity,
                  expansion_add=config.hnsw_expansion_add, expansion_search=config.hnsw_expansion_search)
    if len(keys):
        index.add(np.asarray(keys, np.uint64), np.ascontiguousarray(vectors, np.float32))
    return index


class UsearchOverlay:
    """`index` keys are rows of `base` (float32, shared, never written); `base_ids` maps a row to its id;
    `removed`: base rows a compaction took out of the index (dead, kept in `base` so no row moves).
    With `config`, it compacts itself inside the op once its overlay rows or its hidden rows pass
    memr1's threshold for that base (BankConfig.auto_compact_*), folding them into a copy of its index as
    memr1 folds its graphs (`compact`); forks never do."""

    def __init__(self, index: Index, base: np.ndarray, base_ids: np.ndarray, next_id: int, oversample: float,
                 config=None, removed: np.ndarray | None = None):
        self.index, self.base, self.base_ids, self.oversample = index, base, base_ids, oversample
        self.removed = np.zeros(len(base), bool) if removed is None else removed
        self.config, self.compactions, self.compaction_seconds = config, 0, 0.0
        # (overlay rows, hidden rows) past which it compacts, as memr1's (delta rows, dead base rows)
        self.auto_at = config.auto_compact_thresholds(len(base) - int(self.removed.sum())) if config is not None else None
        self.base_inv = 1.0 / np.linalg.norm(base, axis=1) if len(base) else np.empty(0, np.float32)
        self.base_row = {int(i): r for r, i in enumerate(base_ids.tolist()) if not self.removed[r]}
        self.next_id = next_id
        self.hidden: set[int] = set()          # base rows deleted or superseded
        self.slot: dict[int, int] = {}         # id -> overlay row, for ids that live in the overlay
        self.rows = np.empty((8, DIM), np.float32)
        self.ids = np.empty(8, np.int64)
        self.n, self.dead = 0, []              # overlay rows in use; overlay rows deleted since

    def fork(self) -> "UsearchOverlay":
        c = object.__new__(UsearchOverlay)
        c.__dict__.update(self.__dict__)  # index, base and maps are shared read-only
        c.hidden, c.slot, c.dead = set(self.hidden), dict(self.slot), list(self.dead)
        c.rows, c.ids = self.rows[:self.n].copy(), self.ids[:self.n].copy()  # the rows in use, not the spare
        c.auto_at, c.compactions, c.compaction_seconds = None, 0, 0.0
        return c

    def apply(self, op: tuple) -> int | None:
        kind, mid, vec = op
        if kind == NOOP:
            return None
        if kind == ADD:
            mid = self.next_id
            self.next_id += 1
        elif mid in self.slot:
            row = self.slot.pop(mid)
            self.dead.append(row)
        elif mid in self.base_row and self.base_row[mid] not in self.hidden:
            self.hidden.add(self.base_row[mid])
        else:
            raise KeyError(mid)
        if kind != DELETE:
            if self.n == len(self.rows):
                grow = max(8, self.n)
                self.rows = np.concatenate([self.rows, np.empty((grow, self.rows.shape[1]), np.float32)])
                self.ids = np.concatenate([self.ids, np.empty(grow, np.int64)])
            self.rows[self.n] = vec / np.linalg.norm(vec)
            self.ids[self.n] = mid
            self.slot[mid] = self.n
            self.n += 1
        if self.auto_at is not None and (self.n > self.auto_at[0] or len(self.hidden) > self.auto_at[1]):
            t = time.perf_counter()
            counts = (self.compactions + 1, self.compaction_seconds)
            self.__dict__.update(self.compact(self.config).__dict__)
            self.compactions, self.compaction_seconds = counts[0], counts[1] + time.perf_counter() - t
        return mid

    def search(self, q: np.ndarray, k: int) -> np.ndarray:
        q = q / np.linalg.norm(q)
        want, size = int(k * self.oversample), len(self.index)
        while True:
            keys = self.index.search(q, min(want, size)).keys
            rows = [r for r in keys.tolist() if r not in self.hidden] if self.hidden else keys.astype(np.int64)
            if len(rows) >= k or want >= size:
                break
            want *= 2
        return self.merge(np.asarray(rows, np.int64), q, k)

    @staticmethod
    def search_forks(forks: list["UsearchOverlay"], queries: np.ndarray, k: int) -> list[np.ndarray]:
        """forks[i].search(queries[i], k) for every i, the shared index searched once for all queries
        (usearch's batch search, on one thread as memr1's search_forks runs); a fork whose hidden rows
        leave fewer than k of its candidates searches again on its own."""
        units = queries / np.linalg.norm(queries, axis=1, keepdims=True)
        first = forks[0]
        want = min(int(k * first.oversample), len(first.index))
        found = first.index.search(units, want, threads=1).keys.reshape(len(forks), -1)
        out = []
        for fork, q, keys in zip(forks, units, found):
            rows = [r for r in keys.tolist() if r not in fork.hidden] if fork.hidden else keys.astype(np.int64)
            if len(rows) < k and want < len(fork.index):
                out.append(fork.search(q, k))
                continue
            out.append(fork.merge(np.asarray(rows, np.int64), q, k))
        return out

    @staticmethod
    def search_forks_exact(forks: list["UsearchOverlay"], queries: np.ndarray, k: int) -> list[np.ndarray]:
        """forks[i].search(queries[i], k) for every i with no graph: what a user writes below the size
        where a graph pays (memr1's hnsw_threshold). The shared base is scored for all queries by one f32
        GEMM, each fork's hidden rows masked, the forks' overlays scored in one batched product (padded
        to the largest), and one top k taken over both for every fork at once."""
        first = forks[0]
        units = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
        scores = (units @ first.base.T) * first.base_inv
        scores[:, first.removed] = -np.inf
        for i, fork in enumerate(forks):
            if fork.hidden:
                scores[i, np.fromiter(fork.hidden, np.int64, len(fork.hidden))] = -np.inf
        ids = np.broadcast_to(first.base_ids, scores.shape)
        width = max(fork.n for fork in forks)
        if width:
            rows = np.zeros((len(forks), width, units.shape[1]), np.float32)
            extra_ids = np.full((len(forks), width), -1, np.int64)
            live = np.zeros((len(forks), width), bool)
            for i, fork in enumerate(forks):
                rows[i, :fork.n], extra_ids[i, :fork.n], live[i, :fork.n] = fork.rows[:fork.n], fork.ids[:fork.n], True
                live[i, fork.dead] = False
            extra = np.matmul(rows, units[:, :, None])[:, :, 0]
            extra[~live] = -np.inf
            scores, ids = np.concatenate([scores, extra], axis=1), np.concatenate([ids, extra_ids], axis=1)
        k = min(k, scores.shape[1])
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        top = np.take_along_axis(top, np.argsort(-np.take_along_axis(scores, top, 1), axis=1, kind="stable"), 1)
        best = np.take_along_axis(scores, top, 1)
        found = np.take_along_axis(ids, top, 1)
        return [found[i][best[i] > -np.inf] for i in range(len(forks))]

    def merge(self, rows: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
        """The top k of base `rows` re-scored exactly and this fork's overlay scanned; `q` unit-norm."""
        scores, ids = (self.base[rows] @ q) * self.base_inv[rows], self.base_ids[rows]
        if self.n:
            extra = self.rows[:self.n] @ q
            if self.dead:
                extra[self.dead] = -np.inf
            scores, ids = np.concatenate([scores, extra]), np.concatenate([ids, self.ids[:self.n]])
        top = np.argsort(-scores, kind="stable")[:k]
        return ids[top[scores[top] > -np.inf]]

    def overlay_live(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, rows) of the overlay rows still live."""
        mine = np.ones(self.n, bool)
        mine[self.dead] = False
        return self.ids[:self.n][mine], self.rows[:self.n][mine]

    def live(self) -> tuple[np.ndarray, np.ndarray]:
        keep = ~self.removed
        keep[list(self.hidden)] = False
        ids, rows = self.overlay_live()
        return np.concatenate([self.base_ids[keep], ids]), np.concatenate([self.base[keep], rows])

    def compact(self, config) -> "UsearchOverlay":
        """The baseline's compaction, with an empty overlay after it. As memr1's: incremental while the
        rows it changes stay within config.hnsw_rebuild_at of the index (a copy of the shared index, which
        forks still search, with the hidden rows removed and the live overlay rows appended to the base
        and added), else a new index over the live rows."""
        ids, rows = self.overlay_live()
        hidden = np.fromiter(self.hidden, np.int64, len(self.hidden))
        if len(hidden) + len(rows) > config.hnsw_rebuild_at * len(self.index):
            ids, vectors = self.live()
            return UsearchOverlay(hnsw_index(config, np.arange(len(ids)), vectors), vectors, ids, self.next_id,
                                  self.oversample, config if self.auto_at is not None else None)
        index = self.index.copy()
        if len(hidden):
            index.remove(hidden.astype(np.uint64))
        start = len(self.base)
        if len(rows):
            index.add(np.arange(start, start + len(rows), dtype=np.uint64), rows)
        removed = np.concatenate([self.removed, np.zeros(len(rows), bool)])
        removed[hidden] = True
        return UsearchOverlay(index, np.concatenate([self.base, rows]), np.concatenate([self.base_ids, ids]),
                              self.next_id, self.oversample, config if self.auto_at is not None else None, removed)

    def stats(self) -> dict:
        return {"delta_rows": self.n - len(self.dead), "dead_rows": len(self.hidden),
                "auto_compact_at": self.auto_at and self.auto_at[0], "auto_compact_dead_at": self.auto_at and self.auto_at[1],
                "compactions": self.compactions}


class NumpyBank:
    """Row r holds id `ids[r]`; `row_of[id]` is its row or -1."""

    def __init__(self, vectors: np.ndarray, spare: int = 64):
        n = len(vectors)
        self.m = np.empty((n + spare, DIM), np.float32)
        self.m[:n] = unit(vectors)
        self.ids = np.arange(n + spare, dtype=np.int64)
        self.row_of = np.arange(n + spare, dtype=np.int64)
        self.n = self.next_id = n
        self.dead: list[int] = []

    def fork(self) -> "NumpyBank":
        c = object.__new__(NumpyBank)
        c.m, c.ids, c.row_of = self.m.copy(), self.ids.copy(), self.row_of.copy()
        c.n, c.next_id, c.dead = self.n, self.next_id, list(self.dead)
        return c

    def apply(self, op: tuple) -> int | None:
        kind, mid, vec = op
        if kind == NOOP:
            return None
        if kind == ADD:
            if self.n == len(self.m):
                self.m = np.concatenate([self.m, np.empty_like(self.m)])
                self.ids = np.concatenate([self.ids, np.empty_like(self.ids)])
            if self.next_id == len(self.row_of):
                self.row_of = np.concatenate([self.row_of, np.full_like(self.row_of, -1)])
            mid, row = self.next_id, self.n
            self.next_id, self.n = mid + 1, row + 1
            self.ids[row], self.row_of[mid] = mid, row
        else:
            row = int(self.row_of[mid]) if 0 <= mid < self.next_id else -1
            if row < 0:
                raise KeyError(mid)
            if kind == DELETE:
                self.row_of[mid] = -1
                self.dead.append(row)
                return mid
        self.m[row] = vec / np.linalg.norm(vec)
        return mid

    def search(self, q: np.ndarray, k: int) -> np.ndarray:
        s = self.m[:self.n] @ q
        if self.dead:
            s[self.dead] = -np.inf
        k = min(k, self.n - len(self.dead))
        top = np.argpartition(-s, k - 1)[:k]
        return self.ids[top[np.argsort(-s[top], kind="stable")]]

    def compact(self) -> "NumpyBank":
        keep = np.ones(self.n, bool)
        keep[self.dead] = False
        c = NumpyBank.__new__(NumpyBank)
        c.m = np.concatenate([self.m[:self.n][keep], np.empty((64, DIM), np.float32)])
        c.ids = np.concatenate([self.ids[:self.n][keep], np.zeros(64, np.int64)])
        c.n, c.next_id, c.dead = int(keep.sum()), self.next_id, []
        c.row_of = np.full(self.next_id + 64, -1, np.int64)
        c.row_of[c.ids[:c.n]] = np.arange(c.n)
        return c

    def stats(self) -> dict:
        return {"delta_rows": 0, "dead_rows": len(self.dead)}


class UsearchBank:
    """A usearch.Index used directly as the bank: update = remove + add, delete = remove."""

    def __init__(self, index: Index, next_id: int):
        self.index, self.next_id, self.removed = index, next_id, 0

    def apply(self, op: tuple) -> int | None:
        kind, mid, vec = op
        if kind == ADD:
            mid, self.next_id = self.next_id, self.next_id + 1
        elif kind in (UPDATE, DELETE):
            self.index.remove(mid)
            self.removed += 1
        if kind in (ADD, UPDATE):
            self.index.add(mid, vec)
        return mid

    def search(self, q: np.ndarray, k: int) -> np.ndarray:
        return self.index.search(q, k).keys.astype(np.int64)

    def stats(self) -> dict:
        return {"delta_rows": 0, "dead_rows": self.removed}


# ---- timing ----
def timed(fn, n: int, start: int = 0) -> list[int]:
    out = []
    for i in range(start, start + n):
        t = time.perf_counter_ns()
        fn(i)
        out.append(time.perf_counter_ns() - t)
    return out


def alternate(fns: dict, n, rounds: int = 4) -> dict[str, list[int]]:
    """n samples of each call (n: an int, or a count per call), taken in rounds whose order reverses
    each time, so every side is measured under the same background load."""
    counts = n if isinstance(n, dict) else dict.fromkeys(fns, n)
    samples = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            share = counts[name] // rounds + (r < counts[name] % rounds)  # n in all, however it divides
            samples[name] += timed(fns[name], share, len(samples[name]))
    return samples


def row(impl: str, op: str, size: int, samples_ns: list[int], **extra) -> dict:
    """p50 and p99, and the max and mean: a call that compacts is one rare, long sample. With
    `compaction_s` (the compactions the calls caused), `amortised_us` is the mean plus what of it no
    call paid (`moved_s`: a background thread's), so it counts every compaction once."""
    p50, p99 = percentiles(samples_ns, (50, 99))
    mean_us = float(np.mean(samples_ns)) / 1e3
    amortised = ({"amortised_us": mean_us + extra.get("moved_s", 0.0) * 1e6 / len(samples_ns)}
                 if "compaction_s" in extra else {})
    return {"impl": impl, "op": op, "bank_size": size, "p50_us": p50 / 1e3, "p99_us": p99 / 1e3,
            "max_us": max(samples_ns) / 1e3, "mean_us": mean_us, "n": len(samples_ns), **amortised, **extra}
