"""Memory-op latency: memr1's bank against a usearch.Index used directly as the bank.

    python -m memr1.bench.memory_ops [--quick] --json PATH

Vectors are 384-d points with low intrinsic dimension, like sentence embeddings: clusters in a
24-d latent space, projected up, plus noise. HNSW recall on independent random vectors says nothing
about real embeddings. Both impls share one HNSW graph: memr1 opens the saved index as a read-only view,
the baseline restores a mutable copy of it. The baseline does what a user would write: UPDATE is
remove + add, fork is Index.copy().
"""
import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from usearch.index import Index

from memr1.bench.common import machine_info, percentiles, print_table, write_json
from memr1.memory_store import Add, BankConfig, Delete, MemoryBank, Noop, Update

DIM = 384


def clustered(n: int, seed: int, latent: int = 24, clusters: int = 256) -> np.ndarray:
    shared = np.random.default_rng(1234)  # the same "embedding space" for every call
    projection = shared.standard_normal((latent, DIM)).astype(np.float32)
    centers = 2 * shared.standard_normal((clusters, latent)).astype(np.float32)
    rng = np.random.default_rng(seed)
    z = centers[rng.integers(0, clusters, n)] + rng.standard_normal((n, latent)).astype(np.float32)
    return z @ projection + 0.3 * rng.standard_normal((n, DIM)).astype(np.float32)


def timed(fn, n: int) -> list[int]:
    out = []
    for i in range(n):
        t = time.perf_counter_ns()
        fn(i)
        out.append(time.perf_counter_ns() - t)
    return out


def row(impl, op, size, samples_ns, **extra):
    p50, p99 = percentiles(samples_ns, (50, 99))
    return {"impl": impl, "op": op, "bank_size": size, "p50_us": p50 / 1e3, "p99_us": p99 / 1e3,
            "n": len(samples_ns), **extra}


def recall_at_10(search, exact_ids: list[set]) -> float:
    return float(np.mean([len(set(search(i)) & truth) / 10 for i, truth in enumerate(exact_ids)]))


def bench_size(size: int, n_ops: int, n_slow: int, workdir: Path, hnsw_threshold: int) -> list[dict]:
    vecs = clustered(size + 2 * n_ops, seed=size)
    base, extra = vecs[:size], vecs[size:]
    queries = clustered(200, seed=size + 1)
    t = time.perf_counter()
    bank = MemoryBank.from_arrays(workdir / f"bank-{size}", base, [f"memory {i}" for i in range(size)],
                                  ["user"] * size, ["t"] * size, fsync="never", hnsw_threshold=hnsw_threshold)
    build_s = time.perf_counter() - t
    print(f"  built a {size:,}-row bank in {build_s:.1f}s ({bank.stats()['hnsw_speakers'] and 'HNSW' or 'exact'})")
    rows = []

    # search first, on the pristine bank; recall against exact search over the same live rows
    exact = [set(bank.search(q, 10, exact=True).ids.tolist()) for q in queries]
    rec = recall_at_10(lambda i: bank.search(queries[i], 10).ids.tolist(), exact)
    rows.append(row("memr1", "search", size, timed(lambda i: bank.search(queries[i % 200], 10), n_slow),
                    recall_at_10=rec, mode="hnsw" if bank.stats()["hnsw_speakers"] else "exact"))
    rows.append(row("memr1", "search_exact", size, timed(lambda i: bank.search(queries[i % 200], 10, exact=True),
                                                          min(n_slow, 50)), recall_at_10=1.0))
    # The floor for exact search: one BLAS matvec over the same matrix, no top-k, no Python API.
    rows.append(row("numpy_matvec", "search_exact", size, timed(lambda i: base @ queries[i % 200], min(n_slow, 50))))
    rows.append(row("memr1", "fork", size, timed(lambda i: bank.fork(), n_ops)))
    rng = np.random.default_rng(0)
    to_update = rng.integers(0, size, n_ops)
    to_delete = rng.permutation(size + n_ops)[:n_ops]  # base rows and rows just added
    rows.append(row("memr1", "add", size, timed(lambda i: bank.apply(Add("new", extra[i], "user", "t")), n_ops)))
    rows.append(row("memr1", "update", size, timed(lambda i: bank.apply(Update(int(to_update[i]), "upd", extra[n_ops + i])), n_ops)))
    rows.append(row("memr1", "delete", size, timed(lambda i: bank.apply(Delete(int(to_delete[i]))), n_ops)))
    rows.append(row("memr1", "noop", size, timed(lambda i: bank.apply(Noop()), n_ops)))
    index_file = next((workdir / f"bank-{size}").glob("base-*/hnsw-0.usearch"), None)
    bank.close()

    # the baseline: one mutable usearch index holding the same graph (or a fresh one for small banks)
    if index_file is not None:
        index = Index.restore(str(index_file))
    else:
        index = Index(ndim=DIM, metric="cos")
        index.add(np.arange(size, dtype=np.uint64), base)
    rec = recall_at_10(lambda i: index.search(queries[i], 10).keys.tolist(), exact)
    rows.append(row("usearch", "search", size, timed(lambda i: index.search(queries[i % 200], 10), n_slow),
                    recall_at_10=rec))
    rows.append(row("usearch", "fork", size, timed(lambda i: index.copy(), max(3, min(n_slow, 20)))))
    rows.append(row("usearch", "add", size, timed(lambda i: index.add(size + i, extra[i]), n_slow)))

    base_delete = rng.permutation(size + n_slow)[:n_slow]

    def update(i):
        key = int(to_update[i])
        index.remove(key)
        index.add(key, extra[n_ops + i])
    rows.append(row("usearch", "update", size, timed(update, n_slow)))
    rows.append(row("usearch", "delete", size, timed(lambda i: index.remove(int(base_delete[i])), n_slow)))
    rows.append(row("usearch", "noop", size, timed(lambda i: None, n_ops)))
    for r in rows:
        r["build_s"] = build_s
    return rows


def threshold_sweep(sizes: list[int], n: int) -> list[dict]:
    """Exact vs HNSW search p50 on the same rows, to place BankConfig.hnsw_threshold."""
    rows = []
    queries = clustered(200, seed=7)
    for size in sizes:
        vecs = clustered(size, seed=size + 3)
        bank = MemoryBank.from_arrays(None, vecs, ["m"] * size, ["user"] * size, ["t"] * size, hnsw_threshold=1)
        for mode in ("exact", "hnsw"):
            samples = timed(lambda i: bank.search(queries[i % 200], 10, exact=mode == "exact"), n)
            rows.append(row(f"memr1_{mode}", "search_sweep", size, samples))
    by = {(r["impl"], r["bank_size"]): r["p50_us"] for r in rows}
    cross = next((s for s in sizes if by[("memr1_hnsw", s)] < by[("memr1_exact", s)]), None)
    print(f"  HNSW search beats exact search from {cross:,} rows on" if cross else
          f"  exact search was faster at every swept size up to {sizes[-1]:,}")
    return rows


def ratios(rows: list[dict]) -> list[str]:
    by = {(r["impl"], r["op"], r["bank_size"]): r["p50_us"] for r in rows}
    sizes = sorted({r["bank_size"] for r in rows if r["op"] != "search_sweep"})
    lines = []
    for op in ("add", "update", "delete", "noop", "fork", "search"):
        for size in [s for s in sizes if ("memr1", op, s) in by]:
            if ("usearch", op, size) in by and by[("memr1", op, size)] > 0:
                lines.append(f"{op} @ {size:,}: memr1 is {by[('usearch', op, size)] / by[('memr1', op, size)]:,.1f}x "
                             f"the usearch baseline")
        if len(sizes) > 1:
            lines.append(f"{op}: memr1 p50 at {sizes[-1]:,} / at {sizes[0]:,} = "
                         f"{by[('memr1', op, sizes[-1])] / by[('memr1', op, sizes[0])]:.2f}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="sizes 1e3 and 1e5 only, fewer samples")
    p.add_argument("--json", required=True, help="where to write the results")
    p.add_argument("--hnsw-threshold", type=int, default=BankConfig(dim=DIM).hnsw_threshold)
    args = p.parse_args(argv)
    sizes = [1_000, 100_000] if args.quick else [1_000, 100_000, 1_000_000]
    n_ops, n_slow = (2000, 200) if args.quick else (5000, 500)
    rows = []
    with tempfile.TemporaryDirectory(prefix="memr1-bench-") as tmp:
        for size in sizes:
            rows += bench_size(size, n_ops, n_slow, Path(tmp), args.hnsw_threshold)
    rows += threshold_sweep([2_000, 4_000, 8_000, 16_000, 32_000], n_slow)
    print_table(rows, ["impl", "op", "bank_size", "p50_us", "p99_us", "n", "recall_at_10"])
    for line in ratios(rows):
        print("  " + line)
    write_json(args.json, "memory_ops", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
