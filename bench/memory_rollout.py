"""Rollouts forking one bank, as the manager stage does (rl/task/stages/calls.py: a fork per completion, its ops,
the answers' searches, the fork dropped), and concurrent readers of one bank.

`op = "fork_rollout"`: one timed unit is G x (fork, m ops, one top-k search, drop), for G in 8, 64 and
512 and impl in memr1, usearch_overlay and numpy_copy, over a trainer-style bank (the memory layout of
bench.memory_phases: memr1's rows in the delta, or in a base once the bank compacted itself while it
was built; the overlay's index and numpy's matrix hold the same rows). The ops follow the Memory-R1
mix of this trainer's manager rollouts: ADD 30%, UPDATE 25%, DELETE 22.5%, NOOP 22.5%, from the
per-completion means ADD 0.78, UPDATE 0.65, DELETE 0.59, NONE 0.59 over the 264 manager steps logged
by 13 local training runs (metrics ops_add, ops_update, ops_delete, ops_none; mostly synthetic data),
so m = 3 ops per fork by default (2.6 observed). Updates and deletes hit distinct live rows. memr1
applies them with apply(), one by one as the baselines do; the trainer's apply_batch adds one O(1) fork
for atomicity, which the baselines have no counterpart for.
`op = "fork_ops"` times the same rollouts without the search.
The `*_batched` impls run the same rollouts with a group's forks alive at once and their G searches in
one call: memr1's `search_forks` (memory_store/forks.py) and the overlay's batch search of its shared
index on one thread (UsearchOverlay.search_forks), each against its unbatched twin's root.
`memr1_compacted` runs the same rollouts on a copy of memr1's bank compacted once before them (its rows
carry that compaction's `compact_s`, and `codes_s`, the first batched search that makes the base's i8
codes, both outside the timer, as the overlay's shared index is built outside it): what folding a frozen
bank's delta into a base buys each fork's search, and what it costs.

`op = "search_threads"`: T threads (1, 2, 4) share one bank and split n searches; `qps` is n over the
wall time, `scaling` qps over the one-thread qps, and `cpu_per_wall` the process's CPU time over the
wall time. A search that holds the GIL keeps cpu_per_wall near 1 at any T, however many cores are idle;
one that releases it reaches min(T, free cores) (`cpus` and `load_avg` in the JSON's machine block).
"""
import threading
import time

import numpy as np

from memr1.bench.memory_impls import ADD, DELETE, NOOP, UPDATE, UsearchOverlay, alternate, as_memr1, clustered, row
from memr1.bench.memory_truth import recall, truth_topk
from memr1.memory_store import search_forks

MIX = {ADD: 0.30, UPDATE: 0.25, DELETE: 0.225, NOOP: 0.225}


def plans(scn, group: int, m: int, seed: int) -> list[list[tuple]]:
    rng = np.random.default_rng(seed)
    kinds = rng.choice(list(MIX), size=(group, m), p=list(MIX.values()))
    out = []
    for g in range(group):
        targets = rng.choice(scn.size, m, replace=False).tolist()
        vecs = rng.integers(0, len(scn.pool), m)
        out.append([(kind, None if kind in (ADD, NOOP) else targets[j], None if kind in (DELETE, NOOP) else
                     scn.pool[vecs[j]]) for j, kind in enumerate(kinds[g])])
    return out


def run_forks(root, ops, queries, k, out, ids_of):
    """G rollouts on one bank: fork, apply the fork's ops, search (into `out` unless None), drop.
    `ids_of` reads the ids out of a search result (memr1 returns a SearchResult, baselines the ids)."""
    for g, fork_ops in enumerate(ops):
        fork = root.fork()
        for op in fork_ops:
            fork.apply(op)
        if out is not None:
            out[g] = ids_of(fork.search(queries[g], k))
        del fork


def run_forks_batched(root, ops, queries, k, out, search_all):
    """The same G rollouts with every fork alive at once and their searches in one `search_all` call."""
    forks = []
    for fork_ops in ops:
        forks.append(root.fork())
        for op in fork_ops:
            forks[-1].apply(op)
    if out is not None:
        out[:] = search_all(forks, queries, k)
    del forks


def memr1_search_all(forks, queries, k):
    return [found.ids for found in search_forks(forks, queries, k)]


# A batched impl: (the root it forks, its search of all forks at once).
BATCHED = {"memr1_batched": ("memr1", memr1_search_all),
           "memr1_compacted_batched": ("memr1_compacted", memr1_search_all),
           "usearch_overlay_batched": ("usearch_overlay", UsearchOverlay.search_forks),
           "exact_overlay_batched": ("usearch_overlay", UsearchOverlay.search_forks_exact)}


def rollout_rows(scn, groups, m: int, k: int, rounds: int) -> list[dict]:
    """`scn` is a memory-layout Scenario that nothing has changed. `fork_ops` rows time the same
    rollouts without the search, to show what the fork and the ops cost on their own (the batched
    impls have none: their forks and ops are their unbatched twins')."""
    rows = []
    plain = ("memr1", "memr1_compacted", "usearch_overlay", "numpy_copy")
    roots = dict(scn.impls, memr1_compacted=scn.impls["memr1"].fork())
    t = time.perf_counter()
    roots["memr1_compacted"].compact()
    compact_s = time.perf_counter() - t
    # The first batched search of a base makes its i8 codes (memory_store/forks.py): timed here, outside
    # the rows' timers, as the compaction is.
    t = time.perf_counter()
    search_forks([roots["memr1_compacted"]], clustered(1, seed=0), k)
    codes_s = time.perf_counter() - t
    for group in groups:
        ops = plans(scn, group, m, seed=group)
        memr1_ops = [[as_memr1(op) for op in fork_ops] for fork_ops in ops]
        queries = clustered(group, seed=scn.size + group)
        outs = {impl: [None] * group for impl in (*plain, *BATCHED)}
        # memr1's banks take its op records and return a SearchResult; the baselines take the plain ops.
        plan = {impl: (memr1_ops, lambda found: found.ids) if impl.startswith("memr1") else (ops, lambda found: found)
                for impl in (*plain, *BATCHED)}

        def calls(searched: bool):
            out = outs if searched else dict.fromkeys(plain)
            fns = {impl: (lambda _, impl=impl: run_forks(roots[impl], plan[impl][0], queries, k, out[impl],
                                                         plan[impl][1])) for impl in plain}
            if searched:
                fns.update({impl: (lambda _, impl=impl, root=root, fn=fn: run_forks_batched(
                    roots[root], plan[impl][0], queries, k, out[impl], fn)) for impl, (root, fn) in BATCHED.items()})
            return fns
        states = []
        for fork_ops in ops:
            states.append(scn.truth.fork())
            for op in fork_ops:
                states[-1].apply(op)
        for op_name, searched in (("fork_rollout", True), ("fork_ops", False)):
            samples = alternate(calls(searched), rounds, rounds)
            truth = truth_topk(queries, states, k) if searched else None
            for impl in samples:
                extra = {"recall_at_k": recall(outs[impl], truth, k), "k": k} if searched else {}
                r = row(impl, op_name, scn.size, samples[impl], group=group, layout=scn.layout, ops_per_fork=m,
                        **extra)
                r["per_fork_us"] = r["p50_us"] / group
                if impl.startswith("memr1_compacted"):
                    r["compact_s"] = compact_s
                    r["codes_s"] = codes_s  # paid by the first batched search of the compacted base
                rows.append(r)
    return rows


def threads_qps(search, queries, threads: int, n: int) -> float:
    start = threading.Barrier(threads + 1)
    each = n // threads

    def work(offset):
        start.wait()
        for i in range(offset, offset + each):
            search(queries[i % len(queries)])
    pool = [threading.Thread(target=work, args=(t * each,)) for t in range(threads)]
    for t in pool:
        t.start()
    start.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    for t in pool:
        t.join()
    wall = time.perf_counter() - t0
    return threads * each / wall, (time.process_time() - c0) / wall


def thread_rows(scn, k: int, n: int, rounds: int, threads=(1, 2, 4)) -> list[dict]:
    queries = clustered(256, seed=scn.size + 5)
    fns = {impl: scn.search_fn(impl, k) for impl in scn.impls}
    runs = {(impl, t): [] for impl in fns for t in threads}
    for r in range(rounds):
        for t in threads:
            for impl in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                runs[(impl, t)].append(threads_qps(fns[impl], queries, t, n))
    rows = []
    for impl in fns:
        one = float(np.median([q for q, _ in runs[(impl, 1)]]))
        for t in threads:
            q, cpu = (float(x) for x in np.median(runs[(impl, t)], axis=0))
            rows.append({"impl": impl, "op": "search_threads", "bank_size": scn.size, "layout": scn.layout,
                         "threads": t, "qps": q, "scaling": q / one, "cpu_per_wall": cpu, "n": rounds, "k": k,
                         **scn.stats(impl)})
    return rows
