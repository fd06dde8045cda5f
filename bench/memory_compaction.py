"""bench.memory_ops' `compaction` section: what a compaction costs the searches beside it, and its CPU,
at each graph insertion beam (`hnsw_expansion_add`) swept.

Per swept beam, a disk bank of `size` rows (automatic compaction off, so this section decides when) runs
`cycles` cycles: `changed` updates of base rows (the delta automatic compaction would fold at this
size), then `n_search` searches on the idle bank, then `bank.compact()` in a thread while this thread searches
without pause. Both sides search the same state (a compaction's searches see the old generation whole
until it commits) and the same queries; idle and during alternate cycle by cycle.

Rows (`section` "compaction", `layout` "disk", one set per `expansion_add`):
- `search_idle`, `search_during_compaction`: each search timed alone (p50, p99, max);
- `compaction`: its wall time (`s`), its CPU (`cpu_s`: the process's CPU less this thread's, so the
  graph insertion's own threads count) and `cpu_per_row_us` (CPU over changed rows), medians over the
  cycles, and `recall_at_k` of the graph search after the cycles against exact search of the same bank.
"""
import threading
import time

import msgspec
import numpy as np

from memr1.bench.common import headline_entry
from memr1.bench.memory_impls import UPDATE, as_memr1, clustered, row
from memr1.bench.memory_truth import recall
from memr1.memory_store import MemoryBank

EXPANSIONS = (16, 32, 64)


def compaction_rows(size: int, config, workdir, k: int, n_queries: int, n_search: int, cycles: int = 3,
                    expansions=EXPANSIONS) -> list[dict]:
    vectors, queries = clustered(size, seed=size + 11), clustered(n_queries, seed=size + 12)
    pool = clustered(4096, seed=size + 13)
    changed = config.auto_compact_thresholds(size)[0]
    rows = []
    for beam in expansions:
        cfg = msgspec.structs.replace(config, hnsw_expansion_add=beam, auto_compact_ratio=0.0)
        bank = MemoryBank.from_arrays(workdir / f"compaction-{size}-{beam}", vectors,
                                      [f"memory {i}" for i in range(size)], ["user"] * size, ["t"] * size, config=cfg)
        rng = np.random.default_rng(size + beam)
        idle, during, wall, cpu = [], [], [], []
        for _ in range(cycles):
            for i, target in enumerate(rng.choice(size, changed, replace=False).tolist()):
                bank.apply(as_memr1((UPDATE, target, pool[i % len(pool)])))
            for i in range(n_search):
                t = time.perf_counter_ns()
                bank.search(queries[i % n_queries], k)
                idle.append(time.perf_counter_ns() - t)
            s, c = compact_beside_searches(bank, queries, k, during)
            wall.append(s)
            cpu.append(c)
        found = [bank.search(q, k).ids for q in queries]
        exact = [bank.search(q, k, exact=True).ids for q in queries]
        common = dict(layout="disk", section="compaction", expansion_add=beam, changed_rows=changed, k=k)
        cpu_s = float(np.median(cpu))
        rows += [row("memr1", "search_idle", size, idle, **common),
                 row("memr1", "search_during_compaction", size, during, **common),
                 {"impl": "memr1", "op": "compaction", "bank_size": size, **common, "cycles": cycles,
                  "s": float(np.median(wall)), "cpu_s": cpu_s, "cpu_per_row_us": cpu_s * 1e6 / changed,
                  "recall_at_k": recall(found, exact, k)}]
        bank.close()
        print(f"  compaction {size:,}, expansion_add {beam}: {rows[-1]['s']:.2f} s, "
              f"{rows[-1]['cpu_per_row_us']:.0f} us CPU a changed row")
    return rows


def compact_beside_searches(bank, queries: np.ndarray, k: int, samples: list[int]) -> tuple[float, float]:
    """bank.compact() in a thread while this one searches until it is done; (wall s, CPU s of all but
    this thread). A compaction too short for one search still gets one, timed after it started."""
    done = threading.Event()
    took = []

    def work():
        t = time.perf_counter()
        try:
            bank.compact()
        finally:
            took.append(time.perf_counter() - t)
            done.set()

    process, mine = time.process_time(), time.thread_time()
    thread = threading.Thread(target=work, name="bench-compaction")
    thread.start()
    i = 0
    while not done.is_set() or i == 0:
        t = time.perf_counter_ns()
        bank.search(queries[i % len(queries)], k)
        samples.append(time.perf_counter_ns() - t)
        i += 1
    thread.join()
    other = (time.process_time() - process) - (time.thread_time() - mine)
    return took[0], other


def by_op_and_beam(rows: list[dict]) -> dict:
    return {(r["op"], r["expansion_add"]): r for r in rows if r.get("section") == "compaction"}


def compaction_lines(rows: list[dict]) -> list[str]:
    by = by_op_and_beam(rows)
    return [f"compaction @ {r['bank_size']:,}, expansion_add {beam}: search p99 {by[('search_during_compaction', beam)]['p99_us']:.0f} us "
            f"during, {by[('search_idle', beam)]['p99_us']:.0f} us idle; {r['s']:.2f} s, {r['cpu_per_row_us']:.0f} us CPU "
            f"a changed row ({r['changed_rows']:,}); recall@{r['k']} {r['recall_at_k']:.3f}"
            for (op, beam), r in sorted(by.items()) if op == "compaction"]


def compaction_headline(rows: list[dict], default_beam: int) -> list[dict]:
    """At the bank's own beam: search p99 during a compaction over idle (target 2x at 1e5), and the
    compaction's CPU per changed row."""
    by = by_op_and_beam(rows)
    if ("compaction", default_beam) not in by:
        return []
    idle, during, comp = (by[(op, default_beam)] for op in ("search_idle", "search_during_compaction", "compaction"))
    size = comp["bank_size"]
    return [headline_entry(f"compaction @ {size:,}: search p99 during over idle", during["p99_us"] / idle["p99_us"],
                           f"memr1 search_during_compaction {size:,}", f"memr1 search_idle {size:,}",
                           "search p99 while a compaction runs over search p99 on the idle bank",
                           better="lower", target=2.0 if size == 100_000 else None,
                           during_p99_us=during["p99_us"], idle_p99_us=idle["p99_us"]),
            headline_entry(f"compaction @ {size:,}: CPU per changed row", comp["cpu_per_row_us"],
                           f"memr1 compaction {size:,}", "none", "compaction CPU (all its threads) over changed rows",
                           unit="us", better="lower", recall_at_k=comp["recall_at_k"])]
