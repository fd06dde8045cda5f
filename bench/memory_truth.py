"""The answer key of bench.memory_ops: top-k by float64 cosine over the live rows, which this module
tracks itself from the ops each side was given, so recall is measured against code no side shares.
"""
import numpy as np

from memr1.bench.memory_impls import ADD, DELETE, NOOP, unit


class Truth:
    """The live rows, tracked here from the ops each side was given: `base` rows are ids 0..n-1 and
    `changed` maps an id to its new vector (added or updated) or None (deleted)."""

    def __init__(self, base: np.ndarray):
        self.base, self.changed, self.next_id = base, {}, len(base)

    def fork(self) -> "Truth":
        t = Truth(self.base)
        t.changed, t.next_id = dict(self.changed), self.next_id
        return t

    def apply(self, op: tuple) -> None:
        kind, mid, vec = op
        if kind == ADD:
            mid, self.next_id = self.next_id, self.next_id + 1
        if kind != NOOP:
            self.changed[mid] = None if kind == DELETE else vec


def truth_topk(queries: np.ndarray, states: list[Truth], k: int, chunk: int = 16384) -> list[np.ndarray]:
    """Query i's top-k ids over states[i]'s live rows by float64 cosine (states may repeat)."""
    q = unit(np.asarray(queries, np.float64))
    groups: dict[int, list[int]] = {}
    for i, st in enumerate(states):
        groups.setdefault(id(st), []).append(i)
    best = {g: (np.empty((len(ix), 0)), np.empty((len(ix), 0), np.int64)) for g, ix in groups.items()}
    first = {g: states[ix[0]] for g, ix in groups.items()}

    def merge(g, s, ids):
        bs, bi = best[g]
        s, ids = np.concatenate([bs, s], 1), np.concatenate([bi, np.broadcast_to(ids, s.shape)], 1)
        top = np.argpartition(-s, min(k, s.shape[1]) - 1, axis=1)[:, :k]
        best[g] = np.take_along_axis(s, top, 1), np.take_along_axis(ids, top, 1)

    base = first[next(iter(first))].base
    for start in range(0, len(base), chunk):
        b = unit(base[start:start + chunk].astype(np.float64))
        for g, ix in groups.items():
            s = q[ix] @ b.T
            hide = [i - start for i in first[g].changed if start <= i < start + len(b)]
            s[:, hide] = -np.inf
            merge(g, s, np.arange(start, start + len(b)))
    for g, ix in groups.items():
        live = [(i, v) for i, v in first[g].changed.items() if v is not None]
        if live:
            merge(g, q[ix] @ unit(np.stack([v for _, v in live]).astype(np.float64)).T,
                  np.array([i for i, _ in live]))
    out = [None] * len(states)
    for g, ix in groups.items():
        s, ids = best[g]
        order = np.argsort(-s, axis=1, kind="stable")
        for j, i in enumerate(ix):
            out[i] = ids[j][order[j]][s[j][order[j]] > -np.inf]
    return out


def recall(got: list, truth: list[np.ndarray], k: int) -> float:
    return float(np.mean([len(set(np.asarray(g).tolist()) & set(t.tolist())) / min(k, len(t))
                          for g, t in zip(got, truth)]))
