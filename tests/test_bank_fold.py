"""A compaction carries each speaker's graph over from the generation before (memory_store/graph.py,
fold_graph; segment.py, fold_plan): the dead and changed rows removed, the survivors renamed to their
new rows, the new and changed rows inserted. It must give the graph a rebuild would: every live row of
the speaker exactly once under its new row, none of another speaker's, nothing lost."""
import numpy as np
from usearch.index import Index

from memr1.memory_store import Add, Delete, MemoryBank, Update
from memr1.memory_store import graph, segment

DIM = 32


def clustered(n, seed):
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((max(1, n // 50), DIM)).astype(np.float32)
    v = c[rng.integers(0, len(c), n)] + 0.3 * rng.standard_normal((n, DIM)).astype(np.float32)
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def saved_keys(bank, speaker):
    """The keys of `speaker`'s graph as the bank saved it."""
    i = bank._manifest.speakers_indexed.index(speaker)
    index = Index.restore(str(bank.path / f"base-{bank._manifest.generation}" / f"hnsw-{i}.usearch"), view=True)
    return np.sort(np.asarray(index.keys).astype(np.int64))


def churn(bank, rng, v_new, n_ops):
    """n_ops each of adds, updates and deletes, the speakers alternating."""
    live = sorted(m.id for m in bank)
    doomed = rng.choice(live, 2 * n_ops, replace=False)
    for j in range(n_ops):
        bank.apply(Add(f"new {j}", v_new[j], "AB"[j % 2], "t"))
        bank.apply(Update(int(doomed[j]), f"changed {j}", v_new[n_ops + j]))
        bank.apply(Delete(int(doomed[n_ops + j])))


def folded(monkeypatch):
    """Count graph builds and folds."""
    calls = {"build": 0, "fold": 0}
    build, fold = segment.build_graph, segment.fold_graph

    def counting_build(*a, **kw):
        calls["build"] += 1
        return build(*a, **kw)

    def counting_fold(*a, **kw):
        calls["fold"] += 1
        return fold(*a, **kw)
    monkeypatch.setattr(segment, "build_graph", counting_build)
    monkeypatch.setattr(segment, "fold_graph", counting_fold)
    return calls


def test_a_compaction_folds_the_graph_into_what_a_rebuild_holds(tmp_path, monkeypatch):
    n, n_ops = 3000, 60
    v = clustered(n + 2 * n_ops, 0)
    bank = MemoryBank.from_arrays(tmp_path / "b", v[:n], [f"m{i}" for i in range(n)], ["AB"[i % 2] for i in range(n)],
                                  ["t"] * n, hnsw_threshold=500, auto_compact_ratio=0)
    calls = folded(monkeypatch)
    rng = np.random.default_rng(1)
    for round_ in range(3):   # fold on fold: each generation's graph comes from the one before
        churn(bank, rng, clustered(2 * n_ops, 10 + round_), n_ops)
        bank.compact()
        assert calls == {"build": 0, "fold": 2 * (round_ + 1)}
        work = bank.compaction_graphs   # a fold inserts the added and updated rows, not the bank
        assert work.inserted == 2 * n_ops * (round_ + 1) and min(work.insert_s, work.save_s, work.check_s) > 0
        rows = {s: np.flatnonzero([m.speaker == s for m in bank._segment.memories]) for s in "AB"}
        for s in "AB":
            assert np.array_equal(saved_keys(bank, s), rows[s])   # each live row once, under its new row
            assert bank._segment.graphs[s].unreachable().size <= len(bank._segment.orphans.get(s, []))
        # every live memory is found by a search for its own vector, as in a rebuilt bank
        memories, vectors = bank._segment.memories, bank._segment.vectors   # all of it: compacted
        hits = sum(int(bank.search(vec, 1, speaker=m.speaker).ids[0]) == m.id for m, vec in zip(memories, vectors))
        assert hits >= len(memories) - max(2, len(memories) // 1000)
    bank.close()
    reopened = MemoryBank.open(tmp_path / "b", "r")   # the folded files pass the checksums and open
    assert len(reopened) == len(memories) and int(reopened.search(vectors[0], 1).ids[0]) == memories[0].id
    reopened.close()


def test_more_changes_than_the_share_rebuild_the_graph(tmp_path, monkeypatch):
    n = 1200
    v = clustered(2 * n, 2)
    bank = MemoryBank.from_arrays(tmp_path / "b", v[:n], [f"m{i}" for i in range(n)], ["A"] * n, ["t"] * n,
                                  hnsw_threshold=500, auto_compact_ratio=0, hnsw_rebuild_at=0.25)
    calls = folded(monkeypatch)
    for j in range(n // 5):   # 20% new rows: folded
        bank.apply(Add(f"new {j}", v[n + j], "A", "t"))
    bank.compact()
    assert calls == {"build": 0, "fold": 1} and bank.compaction_graphs.inserted == n // 5
    for j in range(n // 2):   # then 50%: built anew
        bank.apply(Update(j, f"changed {j}", v[n + n // 5 + j]))
    bank.compact()
    assert calls == {"build": 1, "fold": 1}
    assert bank.compaction_graphs.inserted == n // 5 + len(bank)   # a build inserts every row
    assert np.array_equal(saved_keys(bank, "A"), np.arange(len(bank)))
    bank.close()


def test_a_fold_that_loses_many_rows_repairs_them(tmp_path, monkeypatch):
    # Past REPAIR_FROM lost rows a fold re-inserts them and walks again, as a build does.
    n = 1500
    v = clustered(n + 100, 3)
    bank = MemoryBank.from_arrays(tmp_path / "b", v[:n], [f"m{i}" for i in range(n)], ["A"] * n, ["t"] * n,
                                  hnsw_threshold=500, auto_compact_ratio=0)
    for j in range(100):
        bank.apply(Add(f"new {j}", v[n + j], "A", "t"))
    real, seen = graph.lost_rows, []

    def first_reports_many(index, native, screened, vectors):
        seen.append(len(screened))
        return np.sort(np.asarray(index.keys))[::10] if len(seen) == 1 else real(index, native, screened, vectors)
    monkeypatch.setattr(graph, "lost_rows", first_reports_many)
    bank.compact()
    # the fold screens the rows it inserted; after the repair, those and the re-inserted rows
    assert seen == [100, len(np.union1d(np.arange(n, n + 100), np.arange(0, n + 100, 10)))]
    assert np.array_equal(saved_keys(bank, "A"), np.arange(n + 100))
    assert all(int(bank.search(v[i], 1).ids[0]) == i for i in range(0, n + 100, 7))
    bank.close()
