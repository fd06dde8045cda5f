"""A plain Python model of MemoryBank that tests compare the real bank against."""
import copy
import random

import numpy as np

from memr1.memory_store import Add, Delete, Noop, Update


def merge_sources(old: tuple, new) -> tuple:
    """A memory's sources after an op: the old ones, then the op's that are not there yet, in order."""
    return tuple(dict.fromkeys((*old, *new)))


class ModelBank:
    def __init__(self):
        self.rows: dict[int, dict] = {}
        self.next_id = 0
        self.lsn = 0

    def fork(self) -> "ModelBank":
        return copy.deepcopy(self)

    def apply(self, op) -> int | None:
        """Same contract as MemoryBank.apply; raises KeyError on an unknown id before changing anything."""
        if isinstance(op, Add):
            i = self.next_id
            self.rows[i] = dict(text=op.text, speaker=op.speaker, timestamp=op.timestamp, vector=op.vector.copy(),
                                created=self.lsn, updated=self.lsn, previous_text=None,
                                sources=merge_sources((), op.sources))
            self.next_id += 1
        elif isinstance(op, Update):
            old = self.rows[op.id]
            self.rows[op.id] = dict(old, text=op.text, vector=op.vector.copy(), updated=self.lsn,
                                    previous_text=old["text"],
                                    timestamp=old["timestamp"] if op.timestamp is None else op.timestamp,
                                    sources=merge_sources(old["sources"], op.sources))
            i = op.id
        elif isinstance(op, Delete):
            del self.rows[op.id]
            i = op.id
        else:
            assert isinstance(op, Noop)
            i = None
        self.lsn += 1
        return i

    def scores(self, q: np.ndarray, speaker: str | None = None) -> dict[int, float]:
        """Cosine per live id, row by row (a BLAS matmul may round identical rows differently)."""
        q = q.astype(np.float64)
        return {i: float(np.dot(r["vector"].astype(np.float64), q) /
                         (np.linalg.norm(r["vector"].astype(np.float64)) * np.linalg.norm(q)))
                for i, r in self.rows.items() if speaker is None or r["speaker"] == speaker}

    def search(self, q: np.ndarray, k: int, speaker: str | None = None) -> list[int]:
        scores = self.scores(q, speaker)
        return sorted(scores, key=lambda i: (-scores[i], i))[:k]


def assert_same(bank, model: ModelBank, queries=()) -> None:
    live = {m.id: m for m in bank}
    assert sorted(live) == sorted(model.rows), "live id sets differ"
    assert [m.id for m in bank] == sorted(model.rows), "iteration is not in id order"
    assert len(bank) == len(model.rows)
    for i, row in model.rows.items():
        got = bank.get(i)
        assert (got.text, got.speaker, got.timestamp, got.created, got.updated, got.previous_text, got.sources) == (
            row["text"], row["speaker"], row["timestamp"], row["created"], row["updated"], row["previous_text"],
            row["sources"])
        assert type(got.sources) is tuple
    for q in queries:
        for speaker in (None, "A"):
            want = model.search(q, 5, speaker)
            got = bank.search(q, 5, speaker=speaker, exact=True).ids.tolist()
            scores = model.scores(q, speaker)
            # Same ranking up to float32 rounding: equal-scored memories (e.g. equal vectors) may swap.
            assert len(got) == len(want) and all(i in scores for i in got), (got, want)
            assert all(abs(scores[g] - scores[w]) <= 1e-5 for g, w in zip(got, want)), \
                f"exact search differs (speaker={speaker}): {got} != {want}"


def op_stream(seed: int, n: int, dim: int = 16) -> list:
    """A deterministic random op stream that is valid when applied in order. Adds and updates carry 0-3
    source turn ids (drawn from their own generator, so the ops are those of the stream before sources)."""
    rng = random.Random(seed)
    src = random.Random(seed + 7_919)
    vec = np.random.default_rng(seed)
    model, ops = ModelBank(), []

    def turns() -> tuple:
        return tuple(f"D{src.randrange(3)}:{src.randrange(6)}" for _ in range(src.randrange(4)))

    for _ in range(n):
        live = sorted(model.rows)
        kind = rng.random()
        if kind < 0.5 or not live:
            op = Add(f"fact {rng.random():.6f}", vec.standard_normal(dim).astype(np.float32), rng.choice("AB"), "t",
                     turns())
        elif kind < 0.7:
            op = Update(rng.choice(live), f"new {rng.random():.6f}", vec.standard_normal(dim).astype(np.float32),
                        sources=turns())
        elif kind < 0.85:
            op = Delete(rng.choice(live))
        else:
            op = Noop()
        model.apply(op)
        ops.append(op)
    return ops


def model_after(ops, p: int) -> ModelBank:
    model = ModelBank()
    for op in ops[:p]:
        model.apply(op)
    return model
