"""Search on a bank as built, after updates and deletes, and after compaction, with recall@k against
the float64 truth (bench.memory_impls) for every impl and phase.

Phases (row key `phase`): `fresh` (as built); `after_ops` (n updates of base rows, then n deletes of
other base rows, n = min(2,500, size / 10): at 1e5, past memr1's default delta threshold (2,048 rows),
so that its policy acts within the phase); `after_compact` (each impl folded its changes into a new
base: memr1's compact(), the overlay's (incremental as memr1's), the dead rows dropped for numpy; usearch used
as the bank has no compaction, so it has no such row). memr1 compacts on its own past its
BankConfig.auto_compact_* thresholds (`auto_compact_at` delta rows, `auto_compact_dead_at` dead base
rows, `compactions` so far); `memr1_auto_off` is
a fork of the fresh bank given the same ops, which never compacts on its own: the bank without the
policy. memr1's fresh disk row also gives `graph_check_s`, the time of a search of every row's own
vector (outside build_s, which pays its own check: memory_store/graph.py), and what that search misses
on the built graph (`graph_unreachable`, `graph_lost_after_repair`); the usearch impls open the same
checked graph. Each cost is timed where it lands: search per phase, `compact` per impl and size, memr1's
after_ops ops one by one (`phase_ops`: p50, p99, max and mean, compactions included), the other ops in
bench.memory_ops' op rows. `search_vs_dirty` rows time search on forks of the compacted bank against
the rows a compaction would fold (half updates, half deletes of base rows): where the threshold sits.

Layouts (row key `layout`): `disk`, a bank bulk-loaded with from_arrays (an HNSW base from
hnsw_threshold rows on, the graph every usearch impl here opens too); `memory`, the trainer's banks
(rl/: MemoryBank.create(None) and one Add per row, so rows live in the delta and search scans them
exactly, until the bank compacts itself past auto_compact_min_rows; the overlay indexes the same rows).
"""
import time
from pathlib import Path

import numpy as np
from usearch.index import Index

from memr1.bench.memory_impls import (ADD, DELETE, NOOP, UPDATE, NumpyBank, UsearchBank, UsearchOverlay, alternate,
                                      as_memr1, clustered, hnsw_index, row)
from memr1.bench.memory_truth import Truth, recall, truth_topk
from memr1.memory_store import Add, MemoryBank
from memr1.memory_store.graph import SCREEN_BEAM, missed_by_search


def graph_check(index, ids: np.ndarray, vectors: np.ndarray, bank) -> dict:
    """The built graph checked again by a search of every row's own vector, timed: rows
    it misses (`graph_unreachable`), the graph's orphans (scored exactly by every search) and the rows
    it misses that are not orphans (`graph_lost_after_repair`: lost to the agent)."""
    t = time.perf_counter()
    lost = missed_by_search(index, ids.astype(np.uint64), vectors, SCREEN_BEAM)
    orphans = [row for rows in bank._manifest.graph_orphans.values() for row in rows]
    return {"graph_check_s": time.perf_counter() - t, "graph_unreachable": len(lost),
            "graph_lost_after_repair": len(np.setdiff1d(lost.astype(np.int64), orphans)),
            "graph_orphans": len(orphans)}


def saved_graph(bank) -> Path | None:
    """The graph file a disk bank saved for its one speaker (None: a bank in memory, or no graph)."""
    return next(Path(bank.path).glob("base-*/hnsw-0.usearch"), None) if bank.path else None


def graph_view(path: Path, config) -> Index:
    """A usearch view of a saved graph, searched at the bank's own beam (as the bank sets its own)."""
    view = Index.restore(str(path), view=True)
    view.expansion_search = config.hnsw_expansion_search
    return view


def n_changes(size: int) -> int:
    return min(2500, size // 10)


class Scenario:
    """One size and layout: every impl holding the same rows, the truth, and the prepared ops."""

    def __init__(self, size: int, layout: str, config, oversample: float, workdir: Path | None):
        self.size, self.layout, self.config = size, layout, config
        self.vectors = clustered(size, seed=size)
        self.pool = clustered(4096, seed=size + 1)  # vectors for adds and updates
        t = time.perf_counter()
        if layout == "disk":
            bank = MemoryBank.from_arrays(workdir / f"bank-{size}", self.vectors, [f"memory {i}" for i in range(size)],
                                          ["user"] * size, ["t"] * size, config=config)
        else:
            bank = MemoryBank.create(None, config=config)
            for v in self.vectors:
                bank.apply(Add("memory", v, "user", "t"))
        self.build_s = {"memr1": time.perf_counter() - t}
        graph = saved_graph(bank)
        ids = np.arange(size, dtype=np.int64)
        t = time.perf_counter()
        shared = graph_view(graph, config) if graph else hnsw_index(config, ids, self.vectors)
        self.build_s["usearch_overlay"] = time.perf_counter() - t
        self.graph = graph_check(shared, ids, self.vectors, bank) if graph else {}
        self.impls = {"memr1": bank, "usearch_overlay": UsearchOverlay(shared, self.vectors, ids, size, oversample,
                                                                        config),
                      "numpy_copy": NumpyBank(self.vectors)}
        if layout == "disk":  # a mutable copy of the very same graph
            own = Index.restore(str(graph)) if graph else hnsw_index(config, ids, self.vectors)
            own.expansion_search = config.hnsw_expansion_search
            self.impls["usearch"] = UsearchBank(own, size)
        self.truth = Truth(self.vectors)
        rng = np.random.default_rng(size)
        n = n_changes(size)
        picked = rng.permutation(size)[:2 * n]
        self.ops = ([(UPDATE, int(i), self.pool[j]) for j, i in enumerate(picked[:n])] +
                    [(DELETE, int(i), None) for i in picked[n:]])
        self.live_ids = [int(i) for i in rng.permutation(np.setdiff1d(np.arange(size), picked[n:]))]
        print(f"  {layout} bank of {size:,} rows built in {self.build_s['memr1']:.1f}s")

    def queries(self, n: int) -> np.ndarray:
        """Half fresh points; a quarter near updated vectors; a quarter near deleted rows, which a bank
        that forgot a delete would return."""
        rng = np.random.default_rng(self.size + 2)
        upd = [v for kind, _, v in self.ops if kind == UPDATE][: n // 4]
        dead = [self.vectors[i] for kind, i, _ in self.ops if kind == DELETE][: n // 4]
        near = np.array(upd + dead, np.float32).reshape(-1, self.vectors.shape[1])
        near = near + 0.1 * rng.standard_normal(near.shape).astype(np.float32)
        return np.concatenate([clustered(n - len(near), seed=self.size + 3), near]).astype(np.float32)

    def search_fn(self, impl: str, k: int):
        obj = self.impls[impl]
        if impl == "memr1":
            return lambda q: obj.search(q, k).ids
        return lambda q: obj.search(q, k)

    def stats(self, impl: str) -> dict:
        obj = self.impls[impl]
        if impl != "memr1":
            return {**obj.stats(), "mode": "exact" if impl == "numpy_copy" else "hnsw"}
        return bank_stats(obj)

    def close(self):
        self.impls["memr1"].close()


def bank_stats(bank) -> dict:
    s = bank.stats()
    return {"delta_rows": s["delta_rows"], "dead_rows": s["base_dead"], "base_rows": s["base_rows"],
            "mode": "hnsw" if s["hnsw_speakers"] else "exact", "auto_compact_at": bank.auto_compact_at,
            "auto_compact_dead_at": bank.auto_compact_dead_at, "compactions": bank.compactions}


def cycle_threshold(kind: str, delta_at: int, dead_at: int) -> int | None:
    """The count an op kind drives towards a compaction, as its threshold: add, delta rows; update, one
    delta row and one dead base row each, so whichever threshold is lower; delete (of base rows), dead
    rows; noop, none. One past it, the kind's ops have run one whole compaction cycle."""
    return {ADD: delta_at, UPDATE: min(delta_at, dead_at), DELETE: dead_at}.get(kind)


def kind_ops(kind: str, n: int, targets: list[int], pool: np.ndarray) -> list[tuple]:
    """n ops of one kind in the baselines' form: adds and updates take pool vectors, updates and
    deletes hit `targets` (live ids, at least n)."""
    if kind == ADD:
        return [(ADD, None, pool[i % len(pool)]) for i in range(n)]
    if kind == UPDATE:
        return [(UPDATE, int(targets[i]), pool[-1 - i % len(pool)]) for i in range(n)]
    if kind == DELETE:
        return [(DELETE, int(targets[i]), None) for i in range(n)]
    return [(NOOP, None, None)] * n


def compaction_mark(bank) -> tuple:
    """Where the bank's compaction counters stand, for compaction_cost."""
    return bank.compactions, bank.compaction_seconds, bank.compaction_graphs


def compaction_cost(bank, before: tuple) -> dict:
    """The compactions the timed ops caused since `before` (compaction_mark), waited for outside the
    timer, and their wall time: paid inside the op that crossed the threshold (background off) or by a
    thread beside the ops (on; `moved_s`, which the amortised mean adds). Of that time, the graphs'
    part (compaction.GraphWork): `graph_rows` inserted in `graph_insert_s` (what grows with the rows
    a compaction folds), the graphs saved in `graph_save_s` and checked in `graph_check_s`."""
    bank.wait_for_compaction()
    seconds, background = bank.compaction_seconds - before[1], bank.config.auto_compact_background
    graphs, was = bank.compaction_graphs, before[2]
    return {"compacted": bank.compactions - before[0], "compaction_s": seconds, "background": background,
            "moved_s": seconds if background else 0.0, "graph_rows": graphs.inserted - was.inserted,
            "graph_insert_s": graphs.insert_s - was.insert_s, "graph_save_s": graphs.save_s - was.save_s,
            "graph_check_s": graphs.check_s - was.check_s}


def phase_rows(scn: Scenario, k: int, n_queries: int, n_search: int, rounds: int, reps: int) -> list[dict]:
    queries = scn.queries(n_queries)
    rows = []
    shape = {"layout": scn.layout, "k": k, "n_updates": 0, "n_deletes": 0}
    bank, off = scn.impls["memr1"], scn.impls["memr1"].fork()

    def measure(phase: str, impls: list[str]):
        truth = truth_topk(queries, [scn.truth] * len(queries), k)
        fns = {impl: scn.search_fn(impl, k) for impl in impls if impl in scn.impls}
        if phase != "after_compact":
            fns["memr1_auto_off"] = lambda q: off.search(q, k).ids
        hits = {impl: recall([fn(q) for q in queries], truth, k) for impl, fn in fns.items()}
        samples = alternate({impl: (lambda i, fn=fn: fn(queries[i % len(queries)])) for impl, fn in fns.items()},
                            n_search, rounds)
        for impl in fns:
            built = {"build_s": scn.build_s.get(impl)} if phase == "fresh" else {}  # the index the overlay needs
            if phase == "fresh" and impl == "memr1":
                built.update(scn.graph)
            stats = bank_stats(off) if impl == "memr1_auto_off" else scn.stats(impl)
            rows.append(row(impl, "search", scn.size, samples[impl], phase=phase, recall_at_k=hits[impl],
                            live=len(bank), **shape, **stats, **built))

    measure("fresh", list(scn.impls))
    if scn.layout == "disk":
        rows.append(file_check_row(scn, bank, queries, k, n_search, rounds))
    timed_ops, before = [], compaction_mark(bank)
    for op in scn.ops:
        scn.truth.apply(op)
        mine = as_memr1(op)
        off.apply(mine)
        for impl, obj in scn.impls.items():
            if impl == "memr1":
                t = time.perf_counter_ns()
                obj.apply(mine)
                timed_ops.append(time.perf_counter_ns() - t)
            else:
                obj.apply(op)
    shape.update(n_updates=sum(op[0] == UPDATE for op in scn.ops), n_deletes=sum(op[0] == DELETE for op in scn.ops))
    rows.append(row("memr1", "phase_ops", scn.size, timed_ops, layout=scn.layout, n_updates=shape["n_updates"],
                    n_deletes=shape["n_deletes"], auto_compact_at=bank.auto_compact_at,
                    auto_compact_dead_at=bank.auto_compact_dead_at, **compaction_cost(bank, before)))
    measure("after_ops", list(scn.impls))
    rows += compact_rows(scn, reps)
    measure("after_compact", [impl for impl in scn.impls if impl != "usearch"])
    return rows


def file_check_row(scn: Scenario, bank, queries: np.ndarray, k: int, n_search: int, rounds: int) -> dict:
    """The file checks every search of a disk bank starts with (Segment.check_mapped: an fstat per mapped
    file, so a truncated file is an error, not a SIGBUS), timed alone in the same rounds as the whole
    search they belong to: `share` is their p50 over the search's."""
    segment = bank._view[1]
    samples = alternate({"search": lambda i: bank.search(queries[i % len(queries)], k),
                         "checks": lambda i: segment.check_mapped()}, n_search, rounds)
    checks = row("memr1", "search_file_checks", scn.size, samples["checks"], layout=scn.layout, phase="fresh")
    search = row("memr1", "search", scn.size, samples["search"])
    return {**checks, "search_p50_us": search["p50_us"], "share": checks["p50_us"] / search["p50_us"]}


def compact_rows(scn: Scenario, reps: int) -> list[dict]:
    """Each impl folds the after_ops changes into a new base. A memory bank's fork compacts exactly as
    the bank does, so forks give it repeats; a disk bank compacts once (each is a new generation)."""
    bank, overlay, numpy_bank = scn.impls["memr1"], scn.impls["usearch_overlay"], scn.impls["numpy_copy"]
    reps = reps if scn.size <= 10_000 else 1
    samples = {"memr1": [], "usearch_overlay": [], "numpy_copy": []}
    for r in range(reps):
        last = r == reps - 1
        jobs = {"usearch_overlay": lambda: overlay.compact(scn.config), "numpy_copy": numpy_bank.compact}
        if last or scn.layout == "memory":
            jobs["memr1"] = bank.compact if last else bank.fork().compact
        for impl in (list(jobs) if r % 2 == 0 else list(jobs)[::-1]):
            t = time.perf_counter_ns()
            out = jobs[impl]()
            samples[impl].append(time.perf_counter_ns() - t)
            if last and impl != "memr1":
                scn.impls[impl] = out
    return [row(impl, "compact", scn.size, ns, layout=scn.layout, s=float(np.median(ns)) / 1e9)
            for impl, ns in samples.items()]


def dirty_sweep_rows(scn: Scenario, k: int, n_queries: int, n_search: int, rounds: int,
                     counts: list[int]) -> list[dict]:
    """Search p50 against c changes of base rows since the base was built (c/2 updates, c/2 deletes:
    c/2 delta rows, c dead base rows), on forks of the compacted bank, which never compact on their
    own: where the compaction thresholds have to sit to hold search near the fresh p50."""
    queries = clustered(n_queries, seed=scn.size + 4)
    rows = []
    for c in [c for c in counts if c <= scn.size // 10]:
        ids = scn.live_ids[:c]
        changes = ([(UPDATE, i, scn.pool[j % len(scn.pool)]) for j, i in enumerate(ids[:c // 2])] +
                   [(DELETE, i, None) for i in ids[c // 2:]])
        truth, bank, overlay = scn.truth.fork(), scn.impls["memr1"].fork(), scn.impls["usearch_overlay"].fork()
        for op in changes:
            truth.apply(op)
            bank.apply(as_memr1(op))
            overlay.apply(op)
        fns = {"memr1": lambda q: bank.search(q, k).ids, "usearch_overlay": lambda q: overlay.search(q, k)}
        want = truth_topk(queries, [truth] * len(queries), k)
        hits = {impl: recall([fn(q) for q in queries], want, k) for impl, fn in fns.items()}
        samples = alternate({impl: (lambda i, fn=fn: fn(queries[i % len(queries)])) for impl, fn in fns.items()},
                            n_search, rounds)
        stats = {"memr1": bank_stats(bank), "usearch_overlay": overlay.stats()}
        for impl in fns:
            st = stats[impl]
            rows.append(row(impl, "search_vs_dirty", scn.size, samples[impl], layout=scn.layout, k=k, changes=c,
                            delta_rows=st["delta_rows"], dead_rows=st["dead_rows"],
                            dirty_rows=st["delta_rows"] + st["dead_rows"], recall_at_k=hits[impl]))
    return rows
