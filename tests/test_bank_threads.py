"""Threads on one bank: search runs without the GIL, and readers stay right beside a writer that compacts."""
import sys
import threading

import numpy as np

from memr1.memory_store import Add, Delete, MemoryBank, Update


def test_search_releases_the_gil():
    """With a switch interval longer than the test, a thread keeps the GIL until it lets go of it itself.
    The main thread runs again while the other is still searching only if search let go; otherwise it
    runs only once all the searches are done. The searches are exact scans: no usearch call releases it."""
    n, dim, rounds = 20_000, 512, 20
    vectors = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32)
    bank = MemoryBank.from_arrays(None, vectors, ["m"] * n, ["A"] * n, ["t"] * n, hnsw_threshold=10**9)
    query, done = vectors[7].copy(), []

    def searcher():
        for i in range(rounds):
            assert bank.search(query, 3).ids[0] == 7
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
