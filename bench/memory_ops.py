"""Memory-bank ops, search before and after changes, compaction, fork rollouts and concurrent readers:
memr1's bank against what a competent user would write (bench.memory_impls).

    python -m memr1.bench.memory_ops [--quick] [--only SECTION ...] --json PATH

Sections: `phases` (bench.memory_phases: search per phase with recall against a float64 truth, with
memr1's automatic compaction on and off, compact time, op latency on disk banks; search against dirty
rows at the largest HNSW size), `rollout` and `threads` (bench.memory_rollout), `sweep` (exact against
HNSW search, to place hnsw_threshold), `scale` (bench.memory_scale: memr1's disk bank alone at
`--scale-size` rows, 1e6 by default; not in --quick), `burst` (bench.memory_burst: `--burst-size` adds
as fast as one thread makes them, against background compaction with back-pressure: op p99/max, the
largest delta against its limit, close() after), `compaction` (bench.memory_compaction: search p99 while
a compaction runs against idle, and compaction CPU per changed row, at each `hnsw_expansion_add` swept,
with recall), `floor` (bench.memory_floor: memr1's HNSW search p50 against the memory floor of its
walk on this host: hops x one dependent miss + the vectors at streaming bandwidth).
Op rows (`op` in add/update/delete/noop/fork) time one call each on a disk bank after its phases, for
memr1, usearch used as the bank (update = remove + add), the usearch overlay and the numpy matrix
(fork = copying it). Every call is timed alone; sides alternate in rounds; rows give p50, p99, max and
mean. The overlay compacts itself at memr1's threshold too (inside its op, folding its overlay into a
copy of its index as memr1 folds its graphs, or a new index past hnsw_rebuild_at), and its fork copies
only the overlay rows in use. memr1 compacts on its own past its threshold (settings.bank.auto_compact_*): in a background
thread by default (auto_compact_background), else inside the timed op that crosses it. `compacted`
counts the compactions the timed calls caused (waited for outside the timer), `compaction_s` their wall
time, and `amortised_us` the mean with that time added, whoever paid it.
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import numpy as np

from memr1.bench.common import headline_entry, print_table, write_json
from memr1.bench.memory_burst import burst_headline, burst_lines, burst_rows
from memr1.bench.memory_compaction import compaction_headline, compaction_lines, compaction_rows
from memr1.bench.memory_floor import floor_headline, floor_lines, floor_rows
from memr1.bench.memory_impls import ADD, DELETE, DIM, NOOP, UPDATE, alternate, as_memr1, clustered, row
from memr1.bench.memory_phases import (Scenario, compaction_cost, compaction_mark, cycle_threshold, dirty_sweep_rows,
                                      kind_ops, phase_rows)
from memr1.bench.memory_rollout import MIX, rollout_rows, thread_rows
from memr1.bench.memory_scale import scale_rows
from memr1.memory_store import BankConfig, MemoryBank

SECTIONS = ("phases", "rollout", "threads", "sweep", "scale", "burst", "compaction", "floor")


def op_rows(scn: Scenario, n_ops: int, n_slow: int, rounds: int) -> list[dict]:
    """Per-op latency on the bank as bench.memory_phases left it. Each op kind starts with memr1's bank
    and the overlay compacted (untimed) and runs one compaction cycle of theirs: the ops that take
    memr1's count for the kind past its threshold once (add and update: delta rows past auto_compact_at;
    delete: dead base rows past auto_compact_dead_at), or n_ops where the threshold is out of reach. So
    `amortised_us` (the cycle's op times plus its one compaction, over its ops) is the steady state's,
    not a share of a compaction that a short run happened to meet or miss. Updates and deletes hit
    live rows, the same for every impl."""
    rng = np.random.default_rng(scn.size + 6)
    bank = scn.impls["memr1"]
    live = rng.permutation(np.array(scn.live_ids)).tolist()
    rows = []
    for kind in (ADD, UPDATE, DELETE, NOOP):
        bank.wait_for_compaction()
        bank.compact()
        scn.impls["usearch_overlay"] = overlay = scn.impls["usearch_overlay"].compact(scn.config)
        at = cycle_threshold(kind, bank.auto_compact_at, bank.auto_compact_dead_at)
        n = n_ops if kind == NOOP else at + 1 if kind == ADD or at < len(live) else min(n_ops, len(live))
        counts = {"memr1": n, "usearch": min(n, n_slow), "usearch_overlay": n, "numpy_copy": n}
        if kind == NOOP:
            del counts["usearch"]
        seq = kind_ops(kind, n, live[::-1] if kind == DELETE else live, scn.pool)  # deletes from the end
        plan = {impl: [as_memr1(op) for op in seq] if impl == "memr1" else seq for impl in counts}
        fns = {i: (lambda j, obj=scn.impls[i], ops=plan[i]: obj.apply(ops[j])) for i in counts}
        if kind == NOOP:  # the floor of any bank op: one Python-to-native call that does nothing else
            counts["call_floor"], fns["call_floor"] = n, lambda j: bank._core.delta_len
        before = compaction_mark(bank)
        samples = alternate(fns, counts, rounds)
        limits = {"auto_compact_at": bank.auto_compact_at, "auto_compact_dead_at": bank.auto_compact_dead_at}
        extra = {"memr1": {**limits, **compaction_cost(bank, before)},
                 "usearch_overlay": {**limits, "compacted": overlay.compactions,
                                     "compaction_s": overlay.compaction_seconds, "background": False}}
        rows += [row("memr1", "call_floor", scn.size, s, layout=scn.layout) if i == "call_floor" else
                 row(i, kind, scn.size, s, layout=scn.layout, **extra.get(i, {})) for i, s in samples.items()]
        if kind == DELETE:
            live = live[:-n]
    forks = {"memr1": lambda _: bank.fork(), "usearch_overlay": lambda _: scn.impls["usearch_overlay"].fork(),
             "numpy_copy": lambda _: scn.impls["numpy_copy"].fork()}
    counts = {"memr1": n_ops, "usearch_overlay": n_ops, "numpy_copy": 20 if scn.size >= 100_000 else n_slow}
    rows += [row(i, "fork", scn.size, s, layout=scn.layout, delta_rows=bank.stats()["delta_rows"] if i == "memr1"
                 else scn.impls[i].stats()["delta_rows"]) for i, s in alternate(forks, counts, rounds).items()]
    return rows


def threshold_sweep(sizes: list[int], n: int) -> list[dict]:
    """Exact vs HNSW search p50 on the same rows, to place BankConfig.hnsw_threshold."""
    rows = []
    queries = clustered(200, seed=7)
    for size in sizes:
        vecs = clustered(size, seed=size + 3)
        bank = MemoryBank.from_arrays(None, vecs, ["m"] * size, ["user"] * size, ["t"] * size, hnsw_threshold=1)
        samples = alternate({mode: (lambda i, e=mode == "exact": bank.search(queries[i % 200], 10, exact=e))
                             for mode in ("exact", "hnsw")}, n)
        rows += [row(f"memr1_{mode}", "search_sweep", size, s) for mode, s in samples.items()]
    by = {(r["impl"], r["bank_size"]): r["p50_us"] for r in rows}
    cross = next((s for s in sizes if by[("memr1_hnsw", s)] < by[("memr1_exact", s)]), None)
    print(f"  HNSW search beats exact search from {cross:,} rows on" if cross else
          f"  exact search was faster at every swept size up to {sizes[-1]:,}")
    return rows


def where(r: dict) -> str:
    return "background" if r["background"] else "in-op"


def graph_part(r: dict) -> str:
    """The graphs' share of a row's compactions (compaction_cost): the part that grows with the rows folded."""
    if not r.get("graph_rows"):
        return ""
    return (f"; graphs: {r['graph_rows']:,} rows inserted at {r['graph_insert_s'] / r['graph_rows'] * 1e6:.0f} us a "
            f"row, saved in {r['graph_save_s']:.2f} s, checked in {r['graph_check_s']:.2f} s")


def summary(rows: list[dict]) -> list[str]:
    """The ratios the targets are about, from these rows."""
    lines = []
    search = {(r["impl"], r["layout"], r["bank_size"], r["phase"]): r for r in rows if r["op"] == "search"}
    for (impl, layout, size, phase), r in sorted(search.items()):
        fresh = search[(impl, layout, size, "fresh")]["p50_us"]
        if phase != "fresh":
            lines.append(f"search {impl} {layout} {size:,} {phase}: {r['p50_us'] / fresh:.2f}x fresh p50 "
                         f"(delta {r['delta_rows']:,}, dead {r['dead_rows']:,}), recall {r['recall_at_k']:.3f}")
    dirty = {(r["impl"], r["changes"]): r for r in rows if r["op"] == "search_vs_dirty"}
    for (impl, c), r in sorted(dirty.items()):
        if c:
            lines.append(f"search {impl} after {c:,} changes (delta {r['delta_rows']:,}, dead {r['dead_rows']:,}): "
                         f"{r['p50_us'] / dirty[(impl, 0)]['p50_us']:.2f}x none")
    for r in rows:
        if r["op"] == "phase_ops":
            lines.append(f"memr1 {r['layout']} {r['bank_size']:,} after_ops ops: p50 {r['p50_us']:.2f} us, p99 "
                         f"{r['p99_us']:.2f} us, max {r['max_us'] / 1e3:.1f} ms, mean {r['mean_us']:.1f} us, "
                         f"amortised {r['amortised_us']:.1f} us; {r['compacted']} {where(r)} compaction(s) "
                         f"({r['compaction_s']:.2f} s), thresholds {r['auto_compact_at']} delta / "
                         f"{r['auto_compact_dead_at']} dead rows{graph_part(r)}")
    roll = {(r["op"], r["impl"], r["bank_size"], r["group"]): r["p50_us"] for r in rows if r["op"].startswith("fork_")}
    for (op, impl, size, group), p50 in sorted(roll.items()):
        if impl != "memr1":
            lines.append(f"{op} {size:,} G={group}: {impl} / memr1 = {p50 / roll[(op, 'memr1', size, group)]:.2f}x")
    for r in rows:
        if r["impl"] == "memr1_compacted" and r["op"] == "fork_rollout":
            key = ("fork_rollout", "memr1", r["bank_size"], r["group"])
            saved_us = (roll[key] - r["p50_us"]) / r["group"]
            payback = f"repaid after {r['compact_s'] * 1e6 / saved_us:,.0f} forks" if saved_us > 0 else "no saving"
            lines.append(f"fork_rollout {r['bank_size']:,} G={r['group']}: compacting first ({r['compact_s']:.3f} s) "
                         f"saves {saved_us:.1f} us a fork: {payback}; overlay / memr1_compacted = "
                         f"{roll[('fork_rollout', 'usearch_overlay', r['bank_size'], r['group'])] / r['p50_us']:.2f}x")
    for (op, impl, size, group), p50 in sorted(roll.items()):  # batched against batched, and the plain overlay
        if impl == "memr1_compacted_batched":
            lines.append(f"fork_rollout {size:,} G={group}: usearch_overlay_batched / memr1_compacted_batched = "
                         f"{roll[(op, 'usearch_overlay_batched', size, group)] / p50:.2f}x, exact_overlay_batched / "
                         f"memr1_compacted_batched = {roll[(op, 'exact_overlay_batched', size, group)] / p50:.2f}x, "
                         f"usearch_overlay / memr1_compacted_batched = {roll[(op, 'usearch_overlay', size, group)] / p50:.2f}x")
    for r in rows:
        if r["impl"] in ("memr1", "usearch_overlay") and r["op"] in (ADD, UPDATE, DELETE, NOOP, "fork"):
            cost = (f", amortised {r['amortised_us']:.2f} us ({r['compacted']} {where(r)} compaction(s), "
                    f"{r['compaction_s']:.2f} s){graph_part(r)}") if "compaction_s" in r else ""
            lines.append(f"{r['impl']} {r['op']} @ {r['bank_size']:,}: p50 {r['p50_us']:.2f} us, p99 {r['p99_us']:.2f} us, max "
                         f"{r['max_us'] / 1e3:.1f} ms, mean {r['mean_us']:.2f} us{cost}")
        if r["op"] == "build":
            lines.append(f"scale {r['bank_size']:,}: built in {r['s']:.0f} s (RSS {r['rss_mb_before']:,.0f} -> "
                         f"{r['rss_mb_after']:,.0f} MB), {r.get('graph_unreachable')} rows unreachable, "
                         f"{r.get('graph_orphans')} orphans, {r.get('graph_lost_after_repair')} lost")
        if r["op"] in ("compact", "rss") and r.get("section") == "scale":
            lines.append(f"scale {r['bank_size']:,}: " + (f"compaction {r['s']:.0f} s" if r["op"] == "compact"
                                                          else f"peak RSS {r['peak_rss_mb']:,.0f} MB"))
        if r["op"] == "search_threads" and r["threads"] > 1:
            lines.append(f"{r['impl']} {r['layout']} search, {r['threads']} threads: {r['scaling']:.2f}x one "
                         f"thread's qps, CPU {r['cpu_per_wall']:.2f}x wall")
    return lines


def headline(rows: list[dict]) -> list[dict]:
    """The bank's headline entries, at the largest disk size of the phases: per op kind the
    overlay's p50 and amortised mean (compactions included) over memr1's, memr1's op p99 and max while it
    compacts in the background (targets at 1e5); search after the same ops with and without memr1's
    compaction; fork rollouts batched against batched; search threads, the exact/HNSW sweep, the file
    checks' share, bursts and search during compaction; the scale section's op p50, search p50, recall
    and lost rows against their targets at 1e6."""
    out = []
    ops = largest([r for r in rows if r["op"] in (ADD, UPDATE, DELETE) and r.get("section") != "scale"
                   and r.get("layout") == "disk" and r["impl"] in ("memr1", "usearch_overlay")], ("impl", "op"))
    floors = {r["bank_size"]: r["p50_us"] for r in rows if r["op"] == "call_floor"}
    for kind in (ADD, UPDATE, DELETE):
        if ("memr1", kind) not in ops or ("usearch_overlay", kind) not in ops:
            continue
        a, b = ops[("memr1", kind)], ops[("usearch_overlay", kind)]
        size = a["bank_size"]
        floor = {"floor_us": floors[size], "floor_share": floors[size] / a["p50_us"]} if size in floors else {}
        for stat, key in (("p50", "p50_us"), ("amortised mean", "amortised_us")):
            out.append(headline_entry(f"{kind} @ {size:,}: {stat}", b[key] / a[key], f"memr1 {kind} {size:,}",
                                      f"usearch_overlay {kind} {size:,}", f"the overlay's {key} over memr1's",
                                      memr1_us=a[key], overlay_us=b[key], **(floor if key == "p50_us" else {})))
        if kind != ADD:
            out.append(headline_entry(f"{kind} @ {size:,}: memr1 amortised mean", a["amortised_us"],
                                      f"memr1 {kind} {size:,}", "none", "memr1's mean op time, its compactions "
                                      "included", unit="us", better="lower"))
        # What a caller feels: the op's tail while the bank compacts in the background.
        out += [headline_entry(f"{kind} @ {size:,}: memr1 p99", a["p99_us"], f"memr1 {kind} {size:,}", "none",
                               "memr1's op p99, its background compactions running", unit="us", better="lower",
                               target=20.0 if size == 100_000 else None, **floor),
                headline_entry(f"{kind} @ {size:,}: memr1 max", a["max_us"], f"memr1 {kind} {size:,}", "none",
                               "memr1's slowest op", unit="us", better="lower",
                               target=5000.0 if size == 100_000 else None)]
    after = largest([r for r in rows if r["op"] == "search" and r.get("phase") == "after_ops"
                     and r.get("layout") == "disk" and r.get("section") != "scale"], ("impl",))
    after = {k[0]: r for k, r in after.items()}
    for impl, how in (("memr1", "compacting"), ("memr1_auto_off", "not compacting")):
        if impl in after and "usearch_overlay" in after:
            a, b = after[impl], after["usearch_overlay"]
            out.append(headline_entry(f"search after ops @ {a['bank_size']:,}, memr1 {how}",
                                      b["p50_us"] / a["p50_us"], f"{impl} search after_ops", "usearch_overlay search after_ops",
                                      "the overlay's search p50 over memr1's after the same ops",
                                      recall_at_k={impl: a["recall_at_k"], "usearch_overlay": b["recall_at_k"]}))
    roll = {(r["impl"], r["bank_size"], r["group"]): r["p50_us"] for r in rows if r["op"] == "fork_rollout"}
    for (impl, size, group), p50 in sorted(roll.items()):
        overlays = [o for o in ("usearch_overlay_batched", "exact_overlay_batched") if (o, size, group) in roll]
        if impl == "memr1_compacted_batched" and overlays:
            # The baseline at its best: its graph or its exact GEMM scan, whichever was faster at this size.
            best = min(overlays, key=lambda o: roll[(o, size, group)])
            target = 1.5 if group == 64 and size in (1000, 10_000, 100_000) else None
            out.append(headline_entry(f"fork rollout @ {size:,} G={group}", roll[(best, size, group)] / p50,
                                      f"{impl} {size:,} G={group}", f"{best} {size:,} G={group}",
                                      "the faster overlay's rollout p50 (graph or exact scan) over memr1's, both "
                                      "searching batched", target=target))
    threads = largest([r for r in rows if r["op"] == "search_threads" and r["layout"] == "disk"],
                      ("impl", "threads"))
    for (impl, n), r in sorted(threads.items()):
        if impl == "memr1" and n > 1:
            out.append(headline_entry(f"search, {n} threads @ {r['bank_size']:,} ({r['mode']})", r["scaling"],
                                      f"memr1 search_threads {n}", "memr1 search_threads 1",
                                      f"{n} threads' queries per second over one thread's on one bank",
                                      target=1.6 if (n, r["bank_size"], r["mode"]) == (2, 100_000, "hnsw") else None,
                                      cpu_per_wall=r["cpu_per_wall"],
                                      overlay_scaling=threads.get(("usearch_overlay", n), {}).get("scaling")))
    sweep = {(r["impl"], r["bank_size"]): r["p50_us"] for r in rows if r["op"] == "search_sweep"}
    for size in sorted({s for _, s in sweep}):
        out.append(headline_entry(f"sweep {size:,}: exact over HNSW search p50", sweep[("memr1_exact", size)] /
                                  sweep[("memr1_hnsw", size)], f"memr1_hnsw {size:,}", f"memr1_exact {size:,}",
                                  "exact search's p50 over the graph's on the same rows (where hnsw_threshold sits)"))
    checks = largest([r for r in rows if r["op"] == "search_file_checks"], ("impl",))
    for r in checks.values():
        out.append(headline_entry(f"file checks @ {r['bank_size']:,}: share of a search", r["share"],
                                  f"memr1 search_file_checks {r['bank_size']:,}", f"memr1 search {r['bank_size']:,}",
                                  "the p50 of the file checks a disk bank's search starts with, over the whole "
                                  "search's p50", unit="share", better="lower", target=0.05))
    out += burst_headline(rows)
    out += compaction_headline(rows, BankConfig(dim=DIM).hnsw_expansion_add)
    out += floor_headline(rows)
    scale = {(r["op"], r.get("phase")): r for r in rows if r.get("section") == "scale"}
    if scale:
        size = scale[("build", None)]["bank_size"]
        p50 = {k: scale[(k, None)]["p50_us"] for k in (ADD, UPDATE, DELETE, NOOP)}
        search = scale[("search", "fresh")]
        lost = scale[("build", None)].get("graph_lost_after_repair")
        out += [headline_entry(f"scale {size:,}: slowest op kind's p50", max(p50.values()), f"memr1 ops {size:,}",
                               "none", "the largest p50 over add, update, delete and noop", unit="us", better="lower",
                               target=5.0, p50_us=p50),
                headline_entry(f"scale {size:,}: search p50", search["p50_us"], f"memr1 search {size:,}", "none",
                               "search p50 on the fresh bank", unit="us", better="lower", target=2000.0),
                headline_entry(f"scale {size:,}: recall@10", search["recall_at_k"], f"memr1 search {size:,}",
                               "exact search", "the share of exact search's top 10 found", unit="share", target=0.95),
                headline_entry(f"scale {size:,}: rows no search reaches", lost, f"memr1 build {size:,}", "none", "rows neither the graph returns nor kept as orphans",
                               unit="rows", better="lower", target=0)]
    return out


def largest(rows: list[dict], key: tuple[str, ...]) -> dict:
    """`rows` at their largest bank size, by the values of `key`."""
    size = max((r["bank_size"] for r in rows), default=None)
    return {tuple(r[k] for k in key): r for r in rows if r["bank_size"] == size}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller banks, fewer samples, no sweep (a smoke run)")
    p.add_argument("--json", required=True, help="where to write the results")
    p.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], help="disk bank sizes, e.g. 1000,100000")
    p.add_argument("--memory-sizes", type=lambda s: [int(x) for x in s.split(",")], help="memory bank sizes")
    p.add_argument("--scale-size", type=int, default=1_000_000, help="rows of the `scale` section's bank")
    p.add_argument("--burst-size", type=int, help="adds in the `burst` section (100,000; --quick 20,000)")
    p.add_argument("--burst-max-delta", type=int,
                   help="the burst bank's auto_compact_max_delta (BankConfig's default; --quick 4,096, so it binds)")
    p.add_argument("--compaction-size", type=int, help="rows of the `compaction` section's banks (100,000; --quick 10,000)")
    p.add_argument("--ops-per-fork", type=int, default=3)
    p.add_argument("--oversample", type=float, default=2.0, help="the overlay's k multiple (memr1's default)")
    p.add_argument("--hnsw-threshold", type=int, default=BankConfig(dim=DIM).hnsw_threshold)
    p.add_argument("--auto-compact-ratio", type=float, default=BankConfig(dim=DIM).auto_compact_ratio,
                   help="memr1's automatic compaction threshold over its base rows (0: off)")
    p.add_argument("--auto-compact-min-rows", type=int, default=BankConfig(dim=DIM).auto_compact_min_rows)
    p.add_argument("--auto-compact-background", choices=["on", "off"], default="on",
                   help="memr1 compacts in a background thread (on) or inside the op past its threshold (off)")
    args = p.parse_args(argv)
    q = args.quick
    settings = {"disk_sizes": args.sizes or ([1_000, 10_000] if q else [1_000, 10_000, 100_000]),
                "memory_sizes": args.memory_sizes or ([100, 1_000] if q else [100, 1_000, 10_000]),
                "rollout_sizes": [1_000] if q else [1_000, 10_000], "groups": [8, 64, 512],
                "ops_per_fork": args.ops_per_fork, "op_mix": MIX, "k": 10,
                "queries": 50 if q else 200, "n_search": 60 if q else 400, "n_ops": 1000 if q else 5000,
                "n_slow": 100 if q else 500, "rounds": 4, "rollout_rounds": 5 if q else 11,
                "thread_searches": 48 if q else 240, "compact_reps": 1 if q else 3,
                "dirty_changes": [0, 100, 400, 1000] if q else [0, 500, 1000, 2000, 4000, 6000],
                "overlay_oversample": args.oversample,
                "sweep_sizes": [2_000, 4_000, 8_000, 16_000, 32_000], "scale_size": args.scale_size, "dim": DIM,
                "burst_size": args.burst_size or (20_000 if q else 100_000),
                "compaction_size": args.compaction_size or (10_000 if q else 100_000),
                "compaction_cycles": 2 if q else 3,
                "floor_size": 10_000 if q else 100_000,
                "burst_max_delta": args.burst_max_delta or (4_096 if q else BankConfig(dim=DIM).auto_compact_max_delta),
                "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
                "bank": msgspec.structs.asdict(BankConfig(
                    dim=DIM, fsync="never", hnsw_threshold=args.hnsw_threshold,
                    auto_compact_ratio=args.auto_compact_ratio, auto_compact_min_rows=args.auto_compact_min_rows,
                    auto_compact_background=args.auto_compact_background == "on"))}
    s = settings
    config = BankConfig(**s["bank"])
    rows = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memr1-bench-") as tmp:
        if "phases" in args.only or "threads" in args.only:
            layouts = [(layout, size) for layout in ("disk", "memory") for size in s[f"{layout}_sizes"]
                       if "phases" in args.only or size == max(s[f"{layout}_sizes"])]
            for layout, size in layouts:
                scn = Scenario(size, layout, config, args.oversample, Path(tmp))
                largest = size == max(s[f"{layout}_sizes"])
                if "threads" in args.only and largest:  # the bank as built: the memory one all delta
                    rows += thread_rows(scn, s["k"], s["thread_searches"], 3)
                if "phases" in args.only:
                    rows += phase_rows(scn, s["k"], s["queries"], s["n_search"], s["rounds"], s["compact_reps"])
                    if largest and layout == "disk" and size >= config.hnsw_threshold:
                        rows += dirty_sweep_rows(scn, s["k"], s["queries"], s["n_search"] // 2, s["rounds"],
                                                 s["dirty_changes"])
                if "phases" in args.only and layout == "disk":
                    rows += op_rows(scn, s["n_ops"], s["n_slow"], s["rounds"])
                scn.close()
                print(f"  {layout} {size:,} done at {time.perf_counter() - t0:.0f}s")
        if "rollout" in args.only:
            for size in s["rollout_sizes"]:
                scn = Scenario(size, "memory", config, args.oversample, None)
                rows += rollout_rows(scn, s["groups"], s["ops_per_fork"], s["k"], s["rollout_rounds"])
        if "burst" in args.only:
            rows += burst_rows(s["burst_size"], config, s["burst_max_delta"], Path(tmp))
        if "compaction" in args.only:
            rows += compaction_rows(s["compaction_size"], config, Path(tmp), s["k"], s["queries"], s["n_search"],
                                    s["compaction_cycles"])
        if "floor" in args.only:
            rows += floor_rows(s["floor_size"], config, Path(tmp), s["k"], s["queries"], s["n_search"])
        if "scale" in args.only and not q:
            rows += scale_rows(s["scale_size"], config, Path(tmp), s["k"], s["queries"], s["n_search"], s["n_ops"])
    if "sweep" in args.only and not q:
        rows += threshold_sweep(s["sweep_sizes"], s["n_slow"])
    print_table(rows, ["impl", "op", "layout", "bank_size", "phase", "group", "threads", "p50_us", "p99_us", "max_us",
                       "n", "recall_at_k", "delta_rows", "dead_rows", "compacted", "qps"])
    for line in summary(rows) + burst_lines(rows) + compaction_lines(rows) + floor_lines(rows):
        print("  " + line)
    print(f"  ({time.perf_counter() - t0:.0f}s)")
    write_json(args.json, "memory_ops", rows, headline=headline(rows), settings=settings)
    return 0


def one_blas_thread() -> None:
    """Run numpy's matvecs on one thread, as every other side searches, unless OPENBLAS_NUM_THREADS says
    otherwise: OpenBLAS's thread hand-off can cost a matvec over a few thousand rows milliseconds on a
    busy machine. The variable is read at load, so the process starts again with it set."""
    if "OPENBLAS_NUM_THREADS" not in os.environ:
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


if __name__ == "__main__":
    one_blas_thread()
    raise SystemExit(main())
