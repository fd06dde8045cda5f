"""search_forks: one call for the searches of many forks of one bank equals their searches one by one."""
import numpy as np
import pytest

from memr1.memory_store import Add, Delete, InvalidInput, MemoryBank, Update, _core, search_forks


def clustered(n, dim, seed):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((max(1, n // 40), dim)).astype(np.float32)
    return (centers[rng.integers(0, len(centers), n)] + 0.3 * rng.standard_normal((n, dim))).astype(np.float32)


def rollout_forks(root, n, dim, group, seed):
    """`group` forks of `root`, each with its own few ops (the trainer's rollout mix), and their queries."""
    rng = np.random.default_rng(seed)
    fresh = clustered(4 * group, dim, seed + 1)
    forks = []
    for g in range(group):
        fork = root.fork()
        for j, target in enumerate(rng.choice(n, 3, replace=False).tolist()):
            kind = rng.integers(4)
            if kind == 0:
                fork.apply(Add(f"a{g}.{j}", fresh[4 * g + j], "A" if j % 2 else "B"))
            elif kind == 1 and target in fork:
                fork.apply(Update(target, f"u{g}", fresh[4 * g + j]))
            elif kind == 2 and target in fork:
                fork.apply(Delete(target))
        forks.append(fork)
    return forks, clustered(group, dim, seed + 2)


def same(got, want):
    """The same hits, bit for bit: every row that can enter the top k is scored in float32 the way
    bank.search scores it (an exact base's i8 codes only rule rows out)."""
    assert got.ids.tolist() == want.ids.tolist() and got.scores.tolist() == want.scores.tolist(), (got, want)


@pytest.mark.parametrize("layout", ["delta", "exact_base", "graph_base"])
@pytest.mark.parametrize("speaker", [None, "A"])
def test_search_forks_equals_each_search(layout, speaker):
    n, dim = 3_000, 32
    v = clustered(n, dim, 0)
    speakers = ["A", "B"] * (n // 2)
    threshold = 1_000 if layout == "graph_base" else 10**9
    if layout == "delta":  # every row in the delta, as a bank built op by op
        root = MemoryBank.create(None, dim=dim, hnsw_threshold=threshold, auto_compact_ratio=0.0)
        root.apply_batch([Add(f"m{i}", v[i], speakers[i]) for i in range(n)])
    else:
        root = MemoryBank.from_arrays(None, v, [f"m{i}" for i in range(n)], speakers, ["t"] * n,
                                      hnsw_threshold=threshold)
        root.apply_batch([Delete(i) for i in range(0, n, 9)])  # dead base rows every fork skips
    assert bool(root._segment.graphs) == (layout == "graph_base")
    forks, queries = rollout_forks(root, n, dim, 24, seed=5)
    for exact in (False, True):
        got = search_forks(forks, queries, 7, speaker=speaker, exact=exact)
        for fork, q, res in zip(forks, queries, got, strict=True):
            want = fork.search(q, 7, speaker=speaker, exact=exact)
            assert len(res.ids) == 7
            same(res, want)


THREADED = """
import sys, threading
sys.path.insert(0, sys.argv[1])
from test_bank_search_forks import MemoryBank, clustered, rollout_forks, same, search_forks
n, dim = 2_000, 100
root = MemoryBank.from_arrays(None, clustered(n, dim, 0), [f"m{i}" for i in range(n)], ["A", "B"] * (n // 2),
                              ["t"] * n, hnsw_threshold=10**9)
calls = [rollout_forks(root, n, dim, 16, seed=10 * t) for t in range(4)]
got = {}
def search(t):
    got[t] = [search_forks(*calls[t], 5) for _ in range(20)]
workers = [threading.Thread(target=search, args=(t,)) for t in range(4)]
for w in workers:
    w.start()
for w in workers:
    w.join()
for t in range(4):
    want = search_forks(*calls[t], 5)
    for results in got[t]:
        for a, b in zip(results, want, strict=True):
            same(a, b)
print("ok", len(got))
"""


def test_search_forks_from_threads_as_one_after_another():
    """Batched searches from 4 threads at once (16 queries each, so AMX CPUs score the base in tiles)
    return what the same calls return one after another. In a fresh process whose threads search before
    any other does: a thread's tile setup is its own (a new thread inherits its creator's), so a kernel
    that set the tiles up once per process would fault here."""
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-c", THREADED, str(Path(__file__).parent)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.split() == ["ok", "4"], (done.returncode, done.stderr[-2000:])


@pytest.mark.parametrize("dim", [8, 100, 384])
def test_search_forks_exact_base_at_the_edges_of_the_i8_bound(dim):
    """The i8 scores of an exact base rule rows out only where their error bound proves it: near-ties
    (rows that differ by far less than the quantisation error), duplicates, a fork whose dead rows
    outnumber k, a speaker with fewer rows than k, k over the bank's size, and shapes that are no
    multiple of the kernel's blocks (rows, queries, dims)."""
    rng = np.random.default_rng(dim)
    n = 1_001
    v = clustered(n, dim, dim)
    v[500:600] = v[500] + 1e-4 * rng.standard_normal((100, dim)).astype(np.float32)  # near-ties
    v[600:610] = v[600]  # duplicates
    speakers = ["A"] * (n - 5) + ["C"] * 5
    root = MemoryBank.from_arrays(None, v, [f"m{i}" for i in range(n)], speakers, ["t"] * n)
    assert not root._segment.graphs
    forks = [root.fork() for _ in range(23)]
    for g, fork in enumerate(forks):
        if g % 3 == 0:  # many dead base rows, among the rows the queries are nearest to
            fork.apply_batch([Delete(i) for i in range(500, 520 + g)])
        if g % 3 == 1:
            fork.apply_batch([Update(510 + g, f"u{g}", v[0]), Add(f"a{g}", v[501], "A")])
    queries = np.concatenate([v[[500, 501, 600, 0, 999]], clustered(18, dim, dim + 1)])
    queries[:5] += 1e-5 * rng.standard_normal((5, dim)).astype(np.float32)
    for k, speaker in ((7, None), (40, None), (3, "C"), (8, "C"), (5_000, None)):
        got = search_forks(forks, queries, k, speaker=speaker)
        for fork, q, res in zip(forks, queries, got, strict=True):
            same(res, fork.search(q, k, speaker=speaker))


def test_search_forks_inputs():
    v = clustered(100, 8, 1)
    root = MemoryBank.from_arrays(None, v, ["m"] * 100, ["A"] * 100, ["t"] * 100)
    forks = [root.fork() for _ in range(3)]
    assert search_forks([], np.empty((0, 8), np.float32)) == []
    assert [r.ids.tolist() for r in search_forks(forks, v[:3], 1, speaker="nobody")] == [[], [], []]
    with pytest.raises(InvalidInput, match="shape"):
        search_forks(forks, v[:2], 1)
    with pytest.raises(InvalidInput, match="shape"):
        search_forks(forks, v[:3].astype(np.float64), 1)
    with pytest.raises(InvalidInput, match="all zeros"):
        search_forks(forks, np.zeros((3, 8), np.float32), 1)
    other = MemoryBank.from_arrays(None, v, ["m"] * 100, ["A"] * 100, ["t"] * 100)
    with pytest.raises(InvalidInput, match="share a base"):
        search_forks([forks[0], other], v[:2], 1)
    compacted = root.fork()
    compacted.compact()
    with pytest.raises(InvalidInput, match="share a base"):
        search_forks([forks[0], compacted], v[:2], 1)
