"""bench.memory_ops' `burst` section: adds to a disk bank as fast as one thread can make them, with memr1's
background compaction and its back-pressure (BankConfig.auto_compact_max_delta, auto_compact_wait_s).

Every call is timed alone. An op that finds the compaction in flight a limit behind waits for it to
commit, so the burst's p99 and max are what back-pressure costs an op, and its largest delta what it
bounds; `close_s` is close() at the end (at most the one compaction in flight, docs/memory-bank.md).
"""
import time

import msgspec

from memr1.bench.common import headline_entry
from memr1.bench.memory_impls import clustered, row
from memr1.bench.memory_phases import compaction_cost, compaction_mark
from memr1.memory_store import Add, BankConfig, MemoryBank

WAITED_NS = 1_000_000  # an op this slow was held back (or met a commit under the lock)


def burst_rows(n: int, config: BankConfig, max_delta: int, tmp) -> list[dict]:
    config = msgspec.structs.replace(config, auto_compact_max_delta=max_delta)
    vectors = clustered(n, seed=77)
    bank = MemoryBank.create(tmp / "burst", config=config)
    mark, samples, most = compaction_mark(bank), [], 0
    start = time.perf_counter()
    for i in range(n):
        t = time.perf_counter_ns()
        bank.apply(Add(f"burst {i}", vectors[i], "AB"[i % 2]))
        samples.append(time.perf_counter_ns() - t)
        most = max(most, bank._core.delta_len)  # the attribute stats() reads, without building its dict
    wall = time.perf_counter() - start
    limit = config.auto_compact_limit(bank.auto_compact_at or 0)
    compacted_during = bank.compactions - mark[0]
    closing = time.perf_counter()
    bank.close()  # waits for the compaction in flight, which compaction_cost then counts
    close_s = time.perf_counter() - closing
    cost = compaction_cost(bank, mark)
    return [row("memr1", "burst", n, samples, layout="disk", delta_rows=most, delta_limit=limit,
                compacted_during=compacted_during, held_back=sum(s > WAITED_NS for s in samples),
                ops_per_s=n / wall, close_s=close_s, **cost)]


def burst_lines(rows: list[dict]) -> list[str]:
    return [f"memr1 burst of {r['bank_size']:,} adds: p50 {r['p50_us']:.1f} us, p99 {r['p99_us']:.1f} us, max "
            f"{r['max_us'] / 1e3:.1f} ms, {r['ops_per_s']:,.0f} ops/s; {r['held_back']} ops over 1 ms; delta at most "
            f"{r['delta_rows']:,} (limit {r['delta_limit']:,}); {r['compacted_during']} compaction(s) during the "
            f"burst, {r['compacted']} in all ({r['compaction_s']:.2f} s); close {r['close_s']:.2f} s"
            for r in rows if r["op"] == "burst"]


def burst_headline(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        if r["op"] != "burst":
            continue
        size, ours = r["bank_size"], f"memr1 burst {r['bank_size']:,}"
        out += [headline_entry(f"burst @ {size:,}: op p99", r["p99_us"], ours, "none",
                               "p99 of an add during a burst, waits for back-pressure included", unit="us",
                               better="lower", max_us=r["max_us"], held_back=r["held_back"]),
                headline_entry(f"burst @ {size:,}: delta rows past the limit",
                               max(0, r["delta_rows"] - r["delta_limit"]), ours, "none",
                               "the largest delta less the back-pressure limit (an op is let in at it)", unit="rows", better="lower", target=1, delta_limit=r["delta_limit"]),
                headline_entry(f"burst @ {size:,}: close", r["close_s"], ours, "none",
                               "close() after the burst: the compaction in flight at most", unit="s", better="lower")]
    return out
