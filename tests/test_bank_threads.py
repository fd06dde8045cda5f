"""Threads on one bank: search runs without the GIL, and readers stay right beside a writer that compacts."""
import sys
import threading

import numpy as np
import pytest

from memr1.memory_store import Add, Delete, MemoryBank, Update


@pytest.mark.parametrize("graph", [False, True], ids=["exact", "hnsw"])
def test_search_releases_the_gil(graph):
    """With a switch interval longer than the test, a thread keeps the GIL until it lets go of it itself.
    The main thread runs again while the other is still searching only if search let go; otherwise it
    runs only once all the searches are done. Exact scans and HNSW graph searches both let go. Each
    search must take long enough (here about half a millisecond) for the main thread to wake while
    one runs: a search that lets go for a few microseconds takes the GIL back before a waiting thread
    has woken, with or without another core."""
    n, dim, rounds = (8_000, 64, 20) if graph else (20_000, 512, 20)
    k = 500 if graph else 3  # a graph search's work grows with k (its beam is max(k x 2, 64))
    vectors = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32)
    bank = MemoryBank.from_arrays(None, vectors, ["m"] * n, ["A"] * n, ["t"] * n,
                                  hnsw_threshold=1_000 if graph else 10**9)
    assert bool(bank._segment.graphs) == graph
    query, done = vectors[7].copy(), []

    def searcher():
        for i in range(rounds):
            assert bank.search(query, k).ids[0] == 7
            done.append(i)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        worker = threading.Thread(target=searcher)
        worker.start()  # waits (without the GIL) until the worker runs; taking the GIL back comes next
        seen = len(done)
        worker.join()
    finally:
        sys.setswitchinterval(old)
    assert len(done) == rounds
    assert seen < rounds, "the main thread ran only after every search: search held the GIL"


def clustered(n, dim, seed):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((n // 50, dim)).astype(np.float32)
    return (centers[rng.integers(0, len(centers), n)] + 0.3 * rng.standard_normal((n, dim))).astype(np.float32)


@pytest.mark.parametrize("threads", [4, 16])
def test_threads_search_as_sequential_searches(threads):
    """Graph searches from 4 (and 16: more than a machine's cores, which queue for the graph's search
    contexts) threads at once return exactly what the same searches return one after another, over a
    base with dead rows (the filtered graph search) and a delta."""
    n, dim = 12_000, 48
    v = clustered(n, dim, 0)
    bank = MemoryBank.from_arrays(None, v, [f"m{i}" for i in range(n)], ["A"] * (n // 2) + ["B"] * (n // 2),
                                  ["t"] * n, hnsw_threshold=1_000, auto_compact_ratio=0.0)
    fresh = clustered(400, dim, 1)
    bank.apply_batch([Delete(i) for i in range(0, n, 7)] + [Update(i, "u", fresh[i % 400]) for i in range(3, 600, 7)]
                     + [Add(f"a{i}", fresh[i], "A") for i in range(400)])
    assert bank._core.base_dead > 0 and bank._core.delta_len > 0 and set(bank._segment.graphs) == {"A", "B"}
    queries = clustered(threads * 40, dim, 2)
    speakers = [None, "A", "B"]
    ask = [(q, 10, speakers[i % 3]) for i, q in enumerate(queries)]
    want = [bank.search(q, k, speaker=s) for q, k, s in ask]
    got: dict[int, list] = {}

    def searcher(t):
        got[t] = [bank.search(q, k, speaker=s) for q, k, s in ask[t::threads]]

    workers = [threading.Thread(target=searcher, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(got) == threads
    for t in range(threads):
        for a, b in zip(got[t], want[t::threads], strict=True):
            assert a.ids.tolist() == b.ids.tolist() and a.scores.tolist() == b.scores.tolist()
    assert all(len(r.ids) == 10 for r in want)


def test_native_graph_search_finds_the_candidates_usearch_finds(tmp_path):
    """The core searches the file usearch's Python package saved with usearch's C++ core of the same
    version: the same candidate sets as the package's own search (built without its SIMD library, the
    walk's distances may differ in the last bits, so a tie may rarely swap one)."""
    from usearch.index import Index

    from memr1.memory_store import _core

    n, dim = 8_000, 64
    v = clustered(n, dim, 3)
    index = Index(ndim=dim, metric="cos", dtype="i8", connectivity=16, expansion_add=64, expansion_search=64)
    index.add(np.arange(n, dtype=np.uint64), v, threads=2)
    index.save(str(tmp_path / "g.usearch"))
    state = _core.State(dim, 64)
    state.set_base(v, [(i, "m", "A", "t", 0, 0, None, ()) for i in range(n)], n, 0)
    rows = np.empty(0, np.int64)
    for graph in (_core.Graph.view(str(tmp_path / "g.usearch"), 64), _core.Graph.load(index.save(), 64)):
        assert len(graph) == n and graph.dim == dim and graph.expansion_search == 64
        overlap = []
        for q in clustered(200, dim, 4):
            theirs = set(index.search(q, 20).keys.tolist())
            ours = set(state.search(q, 20, None, rows, [graph], 20)[0].tolist())  # every candidate, re-scored
            overlap.append(len(theirs & ours) / 20)
        assert np.mean(overlap) >= 0.99, np.mean(overlap)


def test_readers_beside_a_writer_that_compacts(tmp_path):
    """Readers search continuously while a writer changes other rows and compacts (automatically, and
    explicitly) into new bases with new HNSW graphs. Exact searches must always find a row nobody
    touches, with its exact score; graph searches nearly always (usearch's multi-threaded build leaves
    the odd node unreachable), and never return a score that is not the row's true cosine."""
    dim, n = 32, 3000
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    bank = MemoryBank.from_arrays(tmp_path / "b", vectors, [f"m{i}" for i in range(n)], ["A"] * n, ["t"] * n,
                                  hnsw_threshold=500, auto_compact_min_rows=150, auto_compact_ratio=0.05,
                                  fsync="never")
    stable = list(range(0, n, 2))    # never written
    changing = list(range(1, n, 2))  # updated, deleted, and new rows added, by the writer
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    stop, errors, searches, misses = threading.Event(), [], [0], [0]

    def reader(seed):
        r = np.random.default_rng(seed)
        try:
            while not stop.is_set():
                j = int(r.choice(stable))
                exact = searches[0] % 4 == 0
                got = bank.search(vectors[j], 3, exact=exact)
                for i, score in zip(got.ids.tolist(), got.scores.tolist()):
                    if i < n and i % 2 == 0 and abs(score - float(unit[i] @ unit[j])) > 1e-4:
                        errors.append(("wrong score", j, got.ids.tolist(), got.scores.tolist()))
                if got.ids[0] != j:
                    misses[0] += 1
                    if exact:
                        errors.append(("exact search missed", j, got.ids.tolist()))
                searches[0] += 1
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(repr(e))

    readers = [threading.Thread(target=reader, args=(s,)) for s in range(3)]
    for t in readers:
        t.start()
    try:
        fresh = rng.standard_normal((1500, dim)).astype(np.float32)
        for i in range(1500):
            mid = changing[i % len(changing)]
            if i % 3 == 0:
                bank.apply(Update(mid, f"u{i}", fresh[i]))
            elif i % 3 == 1 and mid in bank:
                bank.apply(Delete(mid))
            else:
                bank.apply(Add(f"a{i}", fresh[i], "A"))
            if i == 700:
                bank.compact()
            if i % 300 == 299:  # background compactions overlap the ops between these waits
                bank.wait_for_compaction()
    finally:
        stop.set()
        for t in readers:
            t.join()
    assert not errors, errors[:5]
    assert bank.compactions >= 3 and searches[0] > 100
    assert misses[0] <= 0.02 * searches[0], (misses[0], searches[0])
    for j in stable[:50]:
        assert bank.search(vectors[j], 1, exact=True).ids.tolist() == [j]
    bank.close()
