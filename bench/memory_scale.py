"""bench.memory_ops' `scale` section: memr1's disk bank alone at one large size (1e6 rows by default),
where no baseline here fits the time budget of a 2-core machine.

Rows (`section` "scale", `layout` "disk", `phase` as in bench.memory_phases):
- `build`: from_arrays of the clustered rows (HNSW build, the reachability check and its repairs,
  the files written), with `graph_unreachable` (rows a search for their own vector misses, checked
  again here on the saved graph), `graph_orphans` (rows every search scores exactly) and
  `graph_lost_after_repair` (unreachable rows that are not orphans: silently lost), and the process RSS
  before and after (`rss_mb_before`, `rss_mb_after`; the f32 rows themselves are 1.5 GB at 1e6 x 384);
- `search` per phase with recall@k against the float64 truth (bench.memory_truth): `fresh`;
  `after_compact` (the bank after the op rows' compactions, with the few rows since); `after_ops` (a
  fork of it given updates and deletes up to both compaction thresholds: the dirtiest bank a search
  meets);
- `add`, `update`, `delete`, `noop`: each call timed alone, on the bank with its automatic compaction
  on. Each kind starts on a freshly compacted bank (untimed) and add, update and delete run one whole
  cycle: the calls that take their count one past its threshold (add and update: `auto_compact_at`
  delta rows; delete: `auto_compact_dead_at` dead base rows; an update adds one of each), so
  `compaction_s` is one compaction at this size and `amortised_us` is the steady state's;
- `compact`: the last compaction's wall time (`s`), from the op rows: a compaction at this size costs
  the same whoever starts it;
- `rss`: the peak RSS of the process (`peak_rss_mb`), truth arrays included.
"""
import time
from pathlib import Path

import numpy as np

from memr1.bench.common import status_mb
from memr1.bench.memory_impls import ADD, DELETE, NOOP, UPDATE, as_memr1, clustered, row, timed
from memr1.bench.memory_phases import (bank_stats, compaction_cost, compaction_mark, cycle_threshold, graph_check,
                                      graph_view, kind_ops, saved_graph)
from memr1.bench.memory_truth import Truth, recall, truth_topk
from memr1.memory_store import MemoryBank


def scale_rows(size: int, config, workdir: Path, k: int, n_queries: int, n_search: int, n_noop: int) -> list[dict]:
    vectors = clustered(size, seed=size)
    rss_before = status_mb("VmRSS")
    t = time.perf_counter()
    bank = MemoryBank.from_arrays(workdir / f"scale-{size}", vectors, [f"memory {i}" for i in range(size)],
                                  ["user"] * size, ["t"] * size, config=config)
    build_s = time.perf_counter() - t
    rows = [{"impl": "memr1", "op": "build", "bank_size": size, "layout": "disk", "section": "scale", "s": build_s,
             "rss_mb_before": rss_before, "rss_mb_after": status_mb("VmRSS"), **check(bank, vectors)}]
    print(f"  scale: {size:,} rows built in {build_s:.0f}s")
    truth, queries = Truth(vectors), clustered(n_queries, seed=size + 3)
    rows.append(search_row(bank, truth, queries, k, n_search, "fresh", size))

    rng = np.random.default_rng(size + 6)
    pool = clustered(4096, seed=size + 1)
    live = rng.permutation(size).tolist()
    last_compact = None
    for kind in (ADD, UPDATE, DELETE, NOOP):
        bank.wait_for_compaction()
        bank.compact()  # untimed: each kind runs one whole cycle, from a compaction to the next
        delta_at, dead_at = bank.auto_compact_at, bank.auto_compact_dead_at
        at = cycle_threshold(kind, delta_at, dead_at)
        n = n_noop if at is None else at + 1
        plan = kind_ops(kind, n, live, pool)
        if kind in (UPDATE, DELETE):
            live = live[n:]
        ops = [as_memr1(op) for op in plan]
        before = compaction_mark(bank)
        samples = timed(lambda i: bank.apply(ops[i]), len(ops))
        cost = compaction_cost(bank, before)
        for op in plan:
            truth.apply(op)
        rows.append(row("memr1", kind, size, samples, layout="disk", section="scale", auto_compact_at=delta_at,
                        auto_compact_dead_at=dead_at, **cost))
        if cost["compacted"]:
            last_compact = cost["compaction_s"] / cost["compacted"]
        print(f"  scale: {len(ops):,} {kind} ops, {cost['compacted']} compaction(s) ({cost['compaction_s']:.0f}s)")
    if last_compact is not None:
        rows.append({"impl": "memr1", "op": "compact", "bank_size": size, "layout": "disk", "section": "scale",
                     "s": last_compact})
    rows.append(search_row(bank, truth, queries, k, n_search, "after_compact", size))
    # The dirtiest bank a search meets: a fork (forks never compact) given as many delta and dead rows as
    # the thresholds allow: updates up to the delta one, then deletes of base rows up to the dead one.
    dirty, dirty_truth = bank.fork(), truth.fork()
    m, d = bank.auto_compact_at, max(0, bank.auto_compact_dead_at - bank.auto_compact_at)
    for op in [(UPDATE, int(i), pool[j % len(pool)]) for j, i in enumerate(live[:m])] + \
              [(DELETE, int(i), None) for i in live[m:m + d]]:
        dirty.apply(as_memr1(op))
        dirty_truth.apply(op)
    rows.append(search_row(dirty, dirty_truth, queries, k, n_search, "after_ops", size))
    rows.append({"impl": "memr1", "op": "rss", "bank_size": size, "layout": "disk", "section": "scale",
                 "peak_rss_mb": status_mb("VmHWM")})
    bank.close()
    return rows


def check(bank, vectors: np.ndarray) -> dict:
    """The reachability of every row in the built graph (bench.memory_phases.graph_check), on the
    graph file the bank wrote."""
    graph = saved_graph(bank)
    if graph is None:
        return {}
    return graph_check(graph_view(graph, bank.config), np.arange(len(vectors), dtype=np.int64), vectors, bank)


def search_row(bank, truth: Truth, queries: np.ndarray, k: int, n_search: int, phase: str, size: int) -> dict:
    expected = truth_topk(queries, [truth] * len(queries), k)
    hits = recall([bank.search(q, k).ids for q in queries], expected, k)
    samples = timed(lambda i: bank.search(queries[i % len(queries)], k), n_search)
    return row("memr1", "search", size, samples, layout="disk", section="scale", phase=phase, k=k,
               recall_at_k=hits, live=len(bank), **bank_stats(bank))
