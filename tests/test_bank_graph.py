"""No row of an HNSW graph is lost: every row is reachable, or an orphan scored exactly (memory_store/graph.py)."""
import numpy as np
import pytest

from memr1.memory_store import BankConfig, Delete, MemoryBank, search_forks
from memr1.memory_store import graph
from memr1.memory_store.graph import build_graph, new_index

DIM = 64


def clustered(n, seed, dim=DIM):
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((n // 50, dim)).astype(np.float32)
    v = c[rng.integers(0, len(c), n)] + 0.3 * rng.standard_normal((n, dim)).astype(np.float32)
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def found(index, keys, vectors, k=100):
    """Which keys a search for their own vector returns (no ties in this data: no duplicate rows)."""
    return (index.search(vectors, k).keys == keys[:, None]).any(1)


def test_threaded_builds_leave_no_row_unreachable():
    # A sparse graph (connectivity 8) built on 2 threads loses a few nodes per 4,000 rows, most builds.
    config = BankConfig(dim=DIM, hnsw_connectivity=8)
    keys = np.arange(4000, dtype=np.uint64)
    raw_lost = missed = walked = 0
    for seed in range(8):
        v = clustered(len(keys), seed)
        plain = new_index(config)
        plain.add(keys, v, threads=2)
        raw_lost += int((~found(plain, keys, v)).sum())
        # the native walk's rows (no link reaches them) are never found by a search
        walk = graph.native(plain, config).unreachable()
        assert not found(plain, walk, v[walk.astype(np.int64)]).any(), f"seed {seed}"
        walked += len(walk)
        index, _, orphans, check = build_graph(keys, v, config, threads=2)
        assert len(index) == len(keys) and check.orphans == len(orphans) <= len(keys) // 100
        assert np.isin(graph.native(index, config).unreachable(), orphans).all(), f"seed {seed}: {check}"
        assert (found(index, keys, v) | np.isin(keys, orphans)).all(), f"seed {seed}: {check}"
        missed += check.missed
    # What the check guards against happens on this data: without it rows would be lost.
    assert raw_lost > 0 and missed > 0 and walked > 0


def test_every_row_of_a_sparse_bank_is_found_by_its_own_vector(tmp_path):
    # Graph and orphans together, through the bank's search, also after a reopen.
    n = 8000
    v = clustered(n, 11)
    bank = MemoryBank.from_arrays(tmp_path / "b", v, [f"m{i}" for i in range(n)], ["AB"[i % 2] for i in range(n)],
                                  ["t"] * n, hnsw_threshold=1000, hnsw_connectivity=8)
    assert bank.stats()["hnsw_speakers"] == ["A", "B"]
    bank.close()
    bank = MemoryBank.open(tmp_path / "b", "r")
    for speaker, g in bank._segment.graphs.items():
        assert np.isin(g.unreachable(), bank._segment.orphans.get(speaker, [])).all()
    missing = [i for i in range(n) if int(bank.search(v[i], 1, speaker="AB"[i % 2]).ids[0]) != i]
    assert not missing


def test_duplicate_vectors_count_as_found():
    # 150 copies of one vector: no graph tells them apart, and a search for it returns k of them. The
    # other rows are each found or orphans, and a copy the check cannot reach at all is an orphan.
    config = BankConfig(dim=DIM)
    v = clustered(3000, 0)
    v[100:250] = v[100]
    keys = np.arange(len(v), dtype=np.uint64)
    index, _, orphans, _ = build_graph(keys, v, config)
    distinct = np.ones(len(v), bool)
    distinct[100:250] = False
    assert (found(index, keys[distinct], v[distinct]) | np.isin(keys[distinct], orphans)).all()
    copies = index.search(v[100], 10)
    assert np.isin(copies.keys, np.arange(100, 250)).all() and (copies.distances <= graph.TIE_DISTANCE).all()
    assert len(orphans) < 150


def test_repaired_graph_survives_save_and_view(tmp_path, monkeypatch):
    monkeypatch.setattr(graph, "REPAIR_FROM", 1)  # repair whatever the check finds
    config = BankConfig(dim=DIM, hnsw_connectivity=8)
    keys = np.arange(4000, dtype=np.uint64)
    for seed in range(8):  # the first build that needed a repair
        v = clustered(len(keys), seed)
        index, _, orphans, check = build_graph(keys, v, config, threads=2)
        if check.repaired:
            break
    else:
        pytest.fail("no build needed a repair")
    index.save(str(tmp_path / "g.usearch"))
    view = type(index).restore(str(tmp_path / "g.usearch"), view=True)
    assert len(view) == len(keys) and (found(view, keys, v) | np.isin(keys, orphans)).all()


def test_orphans_are_searched_exactly_and_kept_in_the_manifest(tmp_path, monkeypatch):
    # Simulate a row no search of the graph reaches: the check reports it, and every search of its
    # speaker scores it, also after reopen and in a bank with no folder.
    n = 600
    v = clustered(2 * n, 1)
    speakers = ["A"] * n + ["B"] * n

    monkeypatch.setattr(graph, "lost_rows", lambda index, *_: np.sort(np.asarray(index.keys))[:1])
    args = (v, [f"m{i}" for i in range(2 * n)], speakers, ["t"] * (2 * n))
    bank = MemoryBank.from_arrays(tmp_path / "b", *args, hnsw_threshold=500)
    assert bank._manifest.graph_orphans == {"A": [0], "B": [n]}
    bank.close()
    disk = MemoryBank.open(tmp_path / "b", "r")
    assert {s: rows.tolist() for s, rows in disk._segment.orphans.items()} == {"A": [0], "B": [n]}
    for bank in (disk, MemoryBank.from_arrays(None, *args, hnsw_threshold=500)):
        assert {s: len(g) for s, g in bank._segment.graphs.items()} == {"A": n, "B": n}
        for row, speaker in ((0, "A"), (n, "B")):
            assert int(bank.search(v[row], 1, speaker=speaker).ids[0]) == row
            assert int(bank.search(v[row], 1).ids[0]) == row
    disk.close()


def test_an_orphan_the_graph_also_returns_is_scored_once(tmp_path, monkeypatch):
    # A few missed rows become orphans without a repair and stay in the graph, which may return them:
    # each search (one query, and a batch over forks) lists every row once.
    n = 800
    v = clustered(n, 2)
    monkeypatch.setattr(graph, "lost_rows", lambda index, *_: np.sort(np.asarray(index.keys))[:5])
    bank = MemoryBank.from_arrays(tmp_path / "b", v, [f"m{i}" for i in range(n)], ["A"] * n, ["t"] * n,
                                  hnsw_threshold=500)
    assert bank._manifest.graph_orphans == {"A": [0, 1, 2, 3, 4]} and len(bank._segment.graphs["A"]) == n
    for row in range(5):
        ids = bank.search(v[row], 20).ids
        assert int(ids[0]) == row and len(set(ids.tolist())) == len(ids) == 20
    forks = [bank.fork() for _ in range(3)]
    got = search_forks(forks, v[:3], 20)
    assert [int(r.ids[0]) for r in got] == [0, 1, 2] and all(len(set(r.ids.tolist())) == 20 for r in got)
    bank.close()


def test_many_lost_rows_are_repaired_and_every_row_checked_again(monkeypatch):
    # Past REPAIR_FROM, lost rows are re-inserted, which rewires their neighbours; the second check
    # covers every row, so a row the repair cut off is an orphan, never silently lost.
    config = BankConfig(dim=DIM, hnsw_connectivity=8)
    keys = np.arange(3000, dtype=np.uint64)
    v = clustered(len(keys), 5)
    calls = []
    real = graph.lost_rows

    def first_reports_many(index, native, screened, vectors):
        calls.append(len(screened))
        return np.sort(np.asarray(index.keys))[::10] if len(calls) == 1 else real(index, native, screened, vectors)
    monkeypatch.setattr(graph, "lost_rows", first_reports_many)
    index, _, orphans, check = build_graph(keys, v, config, threads=2)
    assert calls == [len(keys), len(keys)] and check.missed == 300 and check.orphans == len(orphans)
    assert (found(index, keys, v) | np.isin(keys, orphans)).all()


def test_a_search_among_dead_base_rows_finds_the_live_nearest():
    """Between compactions a bank's base holds dead rows. Scattered (2% of the rows), the graph walks
    plainly for a few more candidates than it needs; clustered around the query (its 40 nearest rows
    deleted), those candidates are all dead and the walk is redone skipping dead rows. Either way the
    result is the exact search's top 10 (at HNSW's recall)."""
    n = 6000
    v = clustered(n, 5)
    bank = MemoryBank.from_arrays(None, v, [f"m{i}" for i in range(n)], ["A"] * n, ["t"] * n, hnsw_threshold=1000,
                                  auto_compact_ratio=0)
    queries = [int(i) for i in np.random.default_rng(0).choice(n, 20, replace=False)]

    def overlap(q):
        got, exact = bank.search(v[q], 10).ids, bank.search(v[q], 10, exact=True).ids
        return len(got), len(set(got.tolist()) & set(exact.tolist()))
    near = bank.search(v[queries[0]], 40, exact=True).ids.tolist()
    scattered = np.random.default_rng(1).choice(np.setdiff1d(np.arange(n), near), n // 50, replace=False)
    for i in scattered.tolist():
        bank.apply(Delete(i))
    assert sum(overlap(q)[1] for q in queries) >= 0.95 * 10 * len(queries)
    for i in near:
        bank.apply(Delete(i))
    assert bank.stats()["base_dead"] * 8 <= n  # still a small share: the plain walk is tried first
    assert overlap(queries[0]) == (10, 10)
