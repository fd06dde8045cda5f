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
    """The same hits: scores within float32 rounding of a sum in another order (an exact base is scored
    by a BLAS product), and the same id at every rank whose score does not tie a neighbour's within it."""
    assert np.allclose(got.scores, want.scores, rtol=0, atol=2e-6), (got, want)
    close = np.abs(np.diff(want.scores)) < 2e-6
    tied = np.zeros(len(want.ids), bool)
    tied[:-1] |= close
    tied[1:] |= close
    assert (got.ids == want.ids)[~tied].all(), (got, want)


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
    with pytest.raises(InvalidInput, match="needs base_dots"):  # the core never scores a base unseen
        _core.search_many([f._core for f in forks], v[:3], 1)
    other = MemoryBank.from_arrays(None, v, ["m"] * 100, ["A"] * 100, ["t"] * 100)
    with pytest.raises(InvalidInput, match="share a base"):
        search_forks([forks[0], other], v[:2], 1)
    compacted = root.fork()
    compacted.compact()
    with pytest.raises(InvalidInput, match="share a base"):
        search_forks([forks[0], compacted], v[:2], 1)
