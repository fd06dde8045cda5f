"""bench.memory_ops' `floor` section: what an HNSW search of a disk bank could cost at best on this host's
memory, beside what memr1's costs.

A graph search is a chain of dependent reads: each hop reads a node's neighbour list, whose address
the hop before gave, then the vectors of the neighbours it has not seen. So its floor is one dependent
cache miss per hop plus the vectors' bytes at streaming bandwidth. Measured here, on the bank's own
graph and queries:
- `visited` and `distances` per search: usearch's counters (nodes expanded, distances computed) on the
  bank's graph file at its beam and candidate count; memr1's walk runs on that graph with that beam,
  so it expands about as many;
- `miss_ns`: one dependent random read (a pointer chase over a random cycle of 64-byte lines, numba)
  over a buffer as large as the graph file, TLB misses included, as the walk's are;
- `stream_gbs`: a plain copy of a buffer that size (bytes read per second).
Row `search_floor`: floor_us = visited x miss_ns + distances x dim bytes (the graph's int8 vectors) /
stream bandwidth, with memr1's search p50 on the same bank and queries, and search_p50 / floor.
"""
import time

import numpy as np

from memr1.bench.common import headline_entry, percentiles
from memr1.bench.memory_impls import clustered
from memr1.memory_store import MemoryBank

LINE = 64   # bytes a cache line holds


def miss_ns(nbytes: int, steps: int = 2_000_000, seed: int = 0) -> float:
    """ns per dependent random read over `nbytes` (one read per 64-byte line, a random cycle), best of 3."""
    import numba

    @numba.njit(cache=False)
    def chase(nxt, steps):
        j = 0
        for _ in range(steps):
            j = nxt[j]
        return j

    lines = max(nbytes // LINE, 2)
    order = np.random.default_rng(seed).permutation(lines).astype(np.int64)
    nxt = np.zeros(lines * (LINE // 8), np.int64)
    nxt[order * (LINE // 8)] = np.roll(order, -1) * (LINE // 8)
    steps = min(steps, 4 * lines)
    chase(nxt, 10)   # compiled outside the timer
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        chase(nxt, steps)
        best = min(best, (time.perf_counter() - t) / steps)
    return best * 1e9


def stream_gbs(nbytes: int) -> float:
    """GB/s read by a plain copy of `nbytes`, best of 3."""
    src = np.ones(max(nbytes // 8, 1), np.float64)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return src.nbytes / best / 1e9


def floor_rows(size: int, config, workdir, k: int, n_queries: int, n_search: int) -> list[dict]:
    from usearch.index import Index

    vectors, queries = clustered(size, seed=size + 21), clustered(n_queries, seed=size + 22)
    bank = MemoryBank.from_arrays(workdir / f"floor-{size}", vectors, [f"memory {i}" for i in range(size)],
                                  ["user"] * size, ["t"] * size, config=config)
    try:
        graph_file = bank.path / f"base-{bank._manifest.generation}" / "hnsw-0.usearch"
        if not graph_file.is_file():
            raise SystemExit(f"floor: a bank of {size:,} rows has no graph (hnsw_threshold {config.hnsw_threshold})")
        samples = []
        for i in range(n_search):
            t = time.perf_counter_ns()
            bank.search(queries[i % n_queries], k)
            samples.append(time.perf_counter_ns() - t)
        index = Index.restore(str(graph_file), view=True)
        index.expansion_search = config.hnsw_expansion_search
        found = index.search(queries, int(k * config.hnsw_oversample))
        visited, distances = found.visited_members / n_queries, found.computed_distances / n_queries
        nbytes = graph_file.stat().st_size
    finally:
        bank.close()
    ns, gbs = miss_ns(nbytes), stream_gbs(nbytes)
    floor_us = (visited * ns + distances * config.dim / gbs) / 1e3
    p50 = percentiles(samples, (50,))[0] / 1e3
    return [{"impl": "memr1", "op": "search_floor", "layout": "disk", "bank_size": size, "section": "floor",
             "visited": visited, "distances": distances, "graph_bytes": nbytes, "miss_ns": ns, "stream_gbs": gbs,
             "floor_us": floor_us, "p50_us": p50, "n": len(samples), "over_floor": p50 / floor_us}]


def floor_lines(rows: list[dict]) -> list[str]:
    return [f"search floor @ {r['bank_size']:,}: {r['visited']:.0f} hops x {r['miss_ns']:.0f} ns + "
            f"{r['distances']:.0f} vectors at {r['stream_gbs']:.1f} GB/s = {r['floor_us']:.1f} us; memr1's "
            f"search p50 {r['p50_us']:.1f} us ({r['over_floor']:.1f}x the floor)"
            for r in rows if r.get("op") == "search_floor"]


def floor_headline(rows: list[dict]) -> list[dict]:
    return [headline_entry(f"HNSW search @ {r['bank_size']:,}: memr1's p50 over the memory floor", r["over_floor"],
                           f"memr1 search_floor {r['bank_size']:,}", "memory floor",
                           "memr1's search p50 over hops x one dependent miss + vectors at stream bandwidth "
                           "(1.0 would be the floor)", better="lower")
            for r in rows if r.get("op") == "search_floor"]
