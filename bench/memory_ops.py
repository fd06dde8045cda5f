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

from memr1.bench.common import percentiles, print_table, write_json
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


class Subject:
    """One bank size: the memr1 bank, the usearch baseline holding the same graph, and their inputs.
    `ops()` gives each (impl, op) as a call that advances its own cursor through prepared inputs."""

    def __init__(self, size: int, n_ops: int, n_slow: int, workdir: Path, hnsw_threshold: int):
        self.size = size
        vecs = clustered(size + 2 * n_ops, seed=size)
        self.base, self.extra = vecs[:size], vecs[size:]
        self.queries = clustered(200, seed=size + 1)
        t = time.perf_counter()
        self.bank = MemoryBank.from_arrays(workdir / f"bank-{size}", self.base, [f"memory {i}" for i in range(size)],
                                           ["user"] * size, ["t"] * size, fsync="never", hnsw_threshold=hnsw_threshold)
        self.build_s = time.perf_counter() - t
        self.mode = "hnsw" if self.bank.stats()["hnsw_speakers"] else "exact"
        print(f"  built a {size:,}-row bank in {self.build_s:.1f}s ({self.mode})")
        index_file = next((workdir / f"bank-{size}").glob("base-*/hnsw-0.usearch"), None)
        if index_file is not None:  # the baseline: a mutable copy of the very same graph
            self.index = Index.restore(str(index_file))
        else:
            self.index = Index(ndim=DIM, metric="cos")
            self.index.add(np.arange(size, dtype=np.uint64), self.base)
        # recall first, on the pristine bank, against exact search over the same live rows
        exact = [set(self.bank.search(q, 10, exact=True).ids.tolist()) for q in self.queries]
        self.recall = {"memr1": recall_at_10(lambda i: self.bank.search(self.queries[i], 10).ids.tolist(), exact),
                       "usearch": recall_at_10(lambda i: self.index.search(self.queries[i], 10).keys.tolist(), exact)}
        rng = np.random.default_rng(0)
        self.to_update = rng.integers(0, size, n_ops)
        self.to_delete = rng.permutation(size + n_ops)[:n_ops]  # base rows and rows just added
        self.base_delete = rng.permutation(size + n_slow)[:n_slow]

    def ops(self, n_ops: int, n_slow: int) -> list[tuple[str, str, object, int]]:
        bank, index, q, extra, size = self.bank, self.index, self.queries, self.extra, self.size
        cur = {}

        def nxt(key):
            cur[key] = cur.get(key, -1) + 1
            return cur[key]

        def usearch_update(_):
            i = nxt("u_upd")
            key = int(self.to_update[i])
            index.remove(key)
            index.add(key, extra[n_ops + i])
        return [
            ("memr1", "search", lambda _: bank.search(q[nxt("s") % 200], 10), n_slow),
            ("memr1", "search_exact", lambda _: bank.search(q[nxt("se") % 200], 10, exact=True), min(n_slow, 50)),
            # The floor for exact search: one BLAS matvec over the same matrix, no top-k, no Python API.
            ("numpy_matvec", "search_exact", lambda _: self.base @ q[nxt("mv") % 200], min(n_slow, 50)),
            ("memr1", "fork", lambda _: bank.fork(), n_ops),
            ("memr1", "add", lambda _: bank.apply(Add("new", extra[nxt("add")], "user", "t")), n_ops),
            ("memr1", "update", lambda _: bank.apply(Update(int(self.to_update[(i := nxt("upd"))]), "upd",
                                                            extra[n_ops + i])), n_ops),
            ("memr1", "delete", lambda _: bank.apply(Delete(int(self.to_delete[nxt("del")]))), n_ops),
            ("memr1", "noop", lambda _: bank.apply(Noop()), n_ops),
            ("usearch", "search", lambda _: index.search(q[nxt("us") % 200], 10), n_slow),
            ("usearch", "fork", lambda _: index.copy(), max(4, min(n_slow, 20))),
            ("usearch", "add", lambda _: index.add(size + nxt("u_add"), extra[cur["u_add"]]), n_slow),
            ("usearch", "update", usearch_update, n_slow),
            ("usearch", "delete", lambda _: index.remove(int(self.base_delete[nxt("u_del")])), n_slow),
            ("usearch", "noop", lambda _: None, n_ops),
        ]


def bench_sizes(sizes: list[int], n_ops: int, n_slow: int, workdir: Path, hnsw_threshold: int,
                rounds: int = 4) -> list[dict]:
    """Each (impl, op) is timed in rounds that alternate between the sizes, so the 1e5/1e3 ratio
    compares samples taken under the same background load."""
    subjects = [Subject(size, n_ops, n_slow, workdir, hnsw_threshold) for size in sizes]
    plans = [s.ops(n_ops, n_slow) for s in subjects]
    rows = []
    for k, (impl, op, _, n) in enumerate(plans[0]):
        samples = {s.size: [] for s in subjects}
        per_round = max(1, n // rounds)
        for r in range(rounds):
            order = subjects if r % 2 == 0 else subjects[::-1]
            for s in order:
                samples[s.size] += timed(plans[subjects.index(s)][k][2], per_round)
        for s in subjects:
            extra = {"build_s": s.build_s}
            if op == "search" or (impl == "memr1" and op == "search_exact"):
                extra["recall_at_10"] = 1.0 if op == "search_exact" else s.recall[impl]
            if impl == "memr1" and op == "search":
                extra["mode"] = s.mode
            rows.append(row(impl, op, s.size, samples[s.size], **extra))
    for s in subjects:
        s.bank.close()
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
        rows += bench_sizes(sizes, n_ops, n_slow, Path(tmp), args.hnsw_threshold)
    rows += threshold_sweep([2_000, 4_000, 8_000, 16_000, 32_000], n_slow)
    print_table(rows, ["impl", "op", "bank_size", "p50_us", "p99_us", "n", "recall_at_10"])
    for line in ratios(rows):
        print("  " + line)
    write_json(args.json, "memory_ops", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
