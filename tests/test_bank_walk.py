"""The graph walk of memory_store/csrc (walk.h, graph.cpp, cosine_i8.cpp): usearch's search step for step,
its distances bit for bit, and a refusal of graph files whose links leave the graph."""
import struct

import numpy as np
import pytest
from usearch.index import Index

from memr1.memory_store import _core
from memr1.memory_store.errors import BankFormatError


def clustered(n, dim, seed):
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(99).standard_normal((32, dim))
    return (centres[rng.integers(0, 32, n)] + 0.3 * rng.standard_normal((n, dim))).astype(np.float32)


def saved_index(path, dtype, n=5_000, dim=48, removed_every=7):
    index = Index(ndim=dim, metric="cos", dtype=dtype, connectivity=16, expansion_add=64, expansion_search=64)
    index.add(np.arange(n, dtype=np.uint64), clustered(n, dim, 1), threads=2)
    if removed_every:
        index.remove(np.arange(0, n, removed_every, dtype=np.uint64))  # tombstones the walk passes through
    index.save(str(path))
    return index


@pytest.mark.parametrize("dtype", ["i8", "f16", "f32"])
def test_the_walk_returns_what_usearch_returns(tmp_path, dtype):
    """With the same distances (the i8 cosine of cosine_i8.h on both sides, usearch's own metric for the
    other types), the walk returns usearch's keys in usearch's order: on a graph with removed nodes, with
    and without keys left out, at k below and above the beam, from a mapped file and from bytes."""
    index = saved_index(tmp_path / "g.usearch", dtype)
    queries = clustered(150, 48, 2)
    excluded = np.arange(1, 5_000, 5, dtype=np.uint64)
    for graph in (_core.Graph.view(str(tmp_path / "g.usearch"), 64), _core.Graph.load(index.save(), 64)):
        for k in (10, 100):
            for skip in (np.empty(0, np.uint64), excluded):
                for q in queries:
                    ours = graph.candidates(q, k, skip)
                    theirs = graph.candidates(q, k, skip, reference=True)
                    assert len(ours) == k and not np.isin(ours, skip).any()
                    assert ours.tolist() == theirs.tolist(), (dtype, k, len(skip))


def test_every_i8_cosine_kernel_gives_the_walk_the_same_distance():
    """The walk's i8 cosine takes per-node sums and one dot product, vectorised by hand for AVX2 and
    AVX-512 VNNI (u8 x i8, with the query shifted by 128); each kernel this CPU runs must equal the plain
    three-sum loop bit for bit (exact integer sums), at lengths with and without a tail and at the
    extremes of int8."""
    rng = np.random.default_rng(0)
    kernels = set()
    for dim in (1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 384, 385, 1024):
        cases = [rng.integers(-128, 128, (2, dim), dtype=np.int8) for _ in range(40)]
        cases += [np.full((2, dim), -128, np.int8), np.full((2, dim), 127, np.int8),
                  np.stack([np.full(dim, -128, np.int8), np.full(dim, 127, np.int8)]),
                  np.zeros((2, dim), np.int8), np.stack([np.zeros(dim, np.int8), np.ones(dim, np.int8)])]
        for a, b in cases:
            got = dict(_core.Graph.cos_i8_kernels(a, b))
            kernels |= set(got)
            assert len(set(got.values())) == 1, (dim, got)
    assert {"reference", "scalar"} <= kernels


def test_every_batched_i8_kernel_gives_the_exact_products():
    """search_forks scores a base for many queries at once (dots_i8_many: tiles of 16 rows x 16 queries
    on AMX CPUs, 4 queries x 4 rows a pass on VNNI CPUs, AVX2 or a plain loop elsewhere); each kernel this
    CPU runs must give numpy's exact integer products, for query and row counts that leave a remainder
    (AMX: fewer than 8 queries, part-filled tiles, more than 4 query tiles) and dims with and without a
    tail, at the extremes of int8."""
    rng = np.random.default_rng(1)
    kernels = set()
    for m, n, dim in ((1, 1, 1), (3, 5, 17), (4, 4, 64), (5, 9, 65), (8, 7, 384), (9, 13, 385), (2, 3, 1024),
                      (8, 1, 3), (16, 16, 64), (17, 33, 384), (70, 40, 100), (64, 50, 1024)):
        codes = rng.integers(-128, 128, (m, dim), dtype=np.int8)
        rows = rng.integers(-128, 128, (n, dim), dtype=np.int8)
        codes[0], rows[0] = -128, -128        # the largest products, in every lane
        if n > 1:
            rows[1] = 127
        shifted = (codes.astype(np.int16) + 128).astype(np.uint8)
        want = codes.astype(np.int64) @ rows.astype(np.int64).T
        for name, got in _core.Graph.dots_i8_many_kernels(shifted, rows, rows.sum(axis=1, dtype=np.int32)):
            kernels.add(name)
            assert got.tolist() == want.tolist(), (name, m, n, dim)
    assert "scalar" in kernels


def test_a_graph_whose_links_leave_it_is_refused(tmp_path):
    """A link naming a node past the graph's end would send a walk outside the mapped file: the graph is
    refused when it is opened, with the node named. (Segment files are also checksummed, so this is
    the last line, for a file damaged in a way that keeps its checksum right.)"""
    path = tmp_path / "g.usearch"
    saved_index(path, "i8", n=300, removed_every=0)
    data = bytearray(path.read_bytes())
    rows, cols = struct.unpack_from("<II", data, 0)
    assert data[8 + rows * cols:8 + rows * cols + 7] == b"usearch"
    _core.Graph.view(str(path), 64)            # whole, it opens
    for slot, damaged in (node_links(data, 0, rows + 5), upper_link_to_a_base_node(data)):
        path.write_bytes(bytes(damaged))
        with pytest.raises(BankFormatError, match=f"node {slot} links outside the graph"):
            _core.Graph.view(str(path), 64)
        with pytest.raises(BankFormatError, match=f"node {slot} links outside the graph"):
            _core.Graph.load(bytes(damaged), 64)


def layout(data):
    """(rows, connectivity, connectivity_base, entry slot, levels, offset of each node) of a saved index."""
    rows, cols = struct.unpack_from("<II", data, 0)
    head = 8 + rows * cols
    _, conn, base, _, entry = struct.unpack_from("<5Q", data, head + 64)
    levels = struct.unpack_from(f"<{rows}h", data, head + 104)
    offsets, at = [], head + 104 + 2 * rows
    for level in levels:
        offsets.append(at)
        at += 10 + 4 + 4 * base + level * (4 + 4 * conn)
    return rows, conn, base, entry, levels, offsets


def node_links(data, slot, target, level=0):
    """A copy of `data` whose node `slot` has its first link at `level` pointing at `target`."""
    rows, conn, base, _, _, offsets = layout(data)
    at = offsets[slot] + 10 + (4 + 4 * base + (level - 1) * (4 + 4 * conn) if level else 0)
    assert struct.unpack_from("<I", data, at)[0] > 0
    damaged = bytearray(data)
    struct.pack_into("<I", damaged, at + 4, target)
    return slot, damaged


def upper_link_to_a_base_node(data):
    """The entry point's first level-1 link pointed at a node of level 0 (a walk would read links that
    node does not have)."""
    _, _, _, entry, levels, _ = layout(data)
    assert levels[entry] >= 1
    return node_links(data, entry, levels.index(0), level=1)
