"""Kernel benchmark: grpo_advantage, gae and logprobs against what a competent user would run instead.

    python -m memr1.bench.kernels [--quick] [--threads N] [--only grpo,gae,logprobs] --json PATH

grpo_advantage (headline): memr1's default path (the C++ loop on CPU, Triton on CUDA) and its torch
reference, eager and torch.compile'd (the C++ loop is a custom op there), against
verl's vectorised variant (index_add_ sums and sums of squares, bench/kernel_baselines.py), eager and
compiled; also a dense view(-1, 8) and, at 4k and 8k, verl's old Python loop. Sizes 4k and 8k (real
batches: 256 to 8k sequences) besides 64k and 1M (quick: up to 64k); groups of 8, members scattered.
Rewards U(0,1) (case "typical") and 1e4 + U(0,1) (case "stress": a large common offset, where the sum
of squares loses its digits). All use the unbiased std with eps 1e-6; errors are the max abs error
against a float64 two-pass reference on the same fp32 rewards. `headline` in the JSON gives verl's time
over memr1's per size and case, mode-matched (eager over eager, compiled over compiled; above 1: memr1
is faster); its `extra` keys hold the mixed-mode ratios (verl's best over memr1's best, verl eager and
verl compiled each over memr1's faster path, and the torch reference path's), never the headline.
gae: memr1's default path (the C++ kernel on CPU, on torch's intra-op threads; Triton on CUDA) and its
torch reference against numba loops (`numba_loop`: a reverse loop over time per row, the headline
baseline; `numba_prange`: its rows under prange, the headline baseline when torch has several threads,
numba getting as many; `numba_time_major`: rows innermost), the loop over time vectorised over the batch
(verl's form), that loop with its body compiled (`batched_loop_compiled`), and on CPU
scipy.signal.lfilter over each sequence's masked-in steps (`scipy_lfilter`); errors against a scalar
float64 loop, every side's outputs checked against memr1's before timing. `stream_copy` is the
bandwidth floor: a copy of as many bytes as GAE must read and write at the least (torch's copy_, on
the same threads as memr1), timed in the same rounds; the headline gives its share of memr1's time. Sizes 64x256, 256x1024 (quick: these two)
and 1024x2048, rows of random length with a masked step inside each; glibc's malloc thresholds are
pinned for these rows (pin_malloc) so that no row pays page faults for the row before it.
logprobs: forward + backward of sum(log-probs) of a [M, 576] x [49152, 576] head: memr1's chunked
path against the naive path (log_softmax of the full logits, gather), TRL's selective_log_softmax over
full logits, and TRL's chunked log-prob function, the one its GRPO trainer calls through its fused LM
head (`trl_chunked`, log-probs only; TRL rows are skipped when TRL is not installed); errors of the
log-probs and both gradients against float64. Each impl runs in a fresh process
(bench/logprobs_worker.py), once per round, in a new random order each round (--logprob-rounds, 5 by
default); rows are medians over the rounds. Peak memory is the rise of the process's peak RSS (VmHWM)
over its RSS before the first call (CUDA: max_memory_allocated over the allocation before).

Times are medians of at least 5 calls after one untimed call (CUDA: triton.testing.do_bench); on CPU
the calls run in interleaved rounds, each in a fresh (seeded) random order, so that load from other
work hits every impl alike and no impl always runs right after another on warm inputs. On a shared
CPU, --threads 1 avoids OpenMP stalls that otherwise swamp the small ops.
"""
import argparse
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from memr1.bench import kernel_baselines as base
from memr1.bench.common import headline_entry, write_json
from memr1.kernels import gae, grpo_advantage
from memr1.kernels._dispatch import native_available, triton_available

GROUP = 8
MIN_CALLS = 5


def cuda_ms(fn):
    import triton.testing
    return float(triton.testing.do_bench(fn, return_mode="median"))


def measure(impls, device, repeat, few=()):
    """Output and first-call seconds of each impl, then the median ms of `repeat` timed calls
    (MIN_CALLS for the `few` slow ones), taken in interleaved rounds, each in a new random order;
    on CUDA do_bench times all but the slow ones."""
    outs, first = {}, {}
    for name, fn in impls.items():
        t0 = time.perf_counter()
        outs[name] = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        first[name] = time.perf_counter() - t0
    ms = {name: cuda_ms(fn) for name, fn in impls.items() if name not in few} if device == "cuda" else {}
    times = {name: [] for name in impls if name not in ms}
    names, order = list(times), random.Random(0)
    for i in range(max(repeat, MIN_CALLS)):
        # A fresh order each round: an impl that runs right after another on the same inputs finds
        # them in cache, so a fixed order would hand that warm start to the same impl every round.
        order.shuffle(names)
        for name in names:
            if name in few and i >= MIN_CALLS:
                continue
            t0 = time.perf_counter()
            impls[name]()
            if device == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t0)
    ms.update({name: statistics.median(ts) * 1e3 for name, ts in times.items()})
    return outs, ms, first


# ----------------------------------------------------------------------------- grpo
GRPO_SIZES = (4096, 8192, 65536, 1 << 20)  # quick runs stop at 64k


def grpo_rounds(n):
    """Interleaved rounds per size: a call at 4k-64k takes tens to hundreds of microseconds, where this
    host's run-to-run swings (up to 1.7x between two modes) need many samples for a stable median."""
    return 200 if n <= 8192 else 100 if n <= 65536 else 15


def bench_grpo(device, quick, rows):
    sizes = [n for n in GRPO_SIZES if not quick or n <= 65536]
    # Compiled once for every size, as a trainer whose batch size changes from step to step would.
    ours_c = torch.compile(lambda r, g, k: grpo_advantage(r, g, k, impl="torch")[0], dynamic=True)
    native_c = torch.compile(lambda r, g, k: grpo_advantage(r, g, k, impl="native")[0], dynamic=True)
    verl_c = torch.compile(base.verl_vectorised, dynamic=True)
    for n in sizes:
        groups = n // GROUP
        gen = torch.Generator().manual_seed(n)
        gid = torch.randperm(n, generator=gen) // GROUP  # members scattered over the batch
        order = torch.argsort(gid, stable=True)  # the contiguous layout dense_view needs
        for case, offset in (("typical", 0.0), ("stress", 1e4)):
            r = (offset + torch.rand(n, generator=gen, dtype=torch.float64)).float()
            truth = base.grpo_truth64(r, gid, GROUP)
            r_dense = r[order].to(device)  # laid out before timing: a dense trainer has it so
            rd, gd = r.to(device), gid.to(device)
            impls = {
                "memr1_torch": lambda: grpo_advantage(rd, gd, groups, impl="torch")[0],
                "memr1_torch_compiled": lambda: ours_c(rd, gd, groups),
                "verl_vectorised": lambda: base.verl_vectorised(rd, gd, groups),
                "verl_vectorised_compiled": lambda: verl_c(rd, gd, groups),
                "dense_view": lambda: base.dense_view(r_dense, GROUP),
            }
            if device == "cuda" and triton_available():
                impls["memr1_triton"] = lambda: grpo_advantage(rd, gd, groups, impl="triton")[0]
            if device == "cpu" and native_available():
                impls["memr1_native"] = lambda: grpo_advantage(rd, gd, groups, impl="native")[0]
                impls["memr1_native_compiled"] = lambda: native_c(rd, gd, groups)
            if n <= 8192:
                idx = gid.tolist()
                impls["verl_loop"] = lambda: base.verl_loop(rd, idx)
            outs, ms, first = measure(impls, device, grpo_rounds(n), few=("verl_loop",))
            for impl in impls:
                want = truth[order] if impl == "dense_view" else truth
                row = {"kernel": "grpo_advantage", "impl": impl, "size": n, "case": case,
                       "rewards": "U(0,1)" if offset == 0 else "1e4+U(0,1)", "device": device, "ms": ms[impl],
                       "max_abs_err": (outs[impl].double().cpu() - want).abs().max().item()}
                if impl.endswith("compiled"):
                    row["first_call_s"] = round(first[impl], 2)  # includes any (re)compilation
                rows.append(row)
                print_row(row)


# memr1's row that the ratios are taken against, first present wins: the path `auto` runs (Triton on
# CUDA, the C++ loop on CPU where the kernel has one), else the torch reference.
EAGER_BASE = ("memr1_triton", "memr1_native", "memr1_torch")
COMPILED_BASE = ("memr1_native_compiled", "memr1_torch_compiled")


def base_impl(impls, compiled: bool):
    """The name in `impls` (a collection of impl names) that memr1's ratios are taken against, or None."""
    return next((i for i in (COMPILED_BASE if compiled else EAGER_BASE) if i in impls), None)


def headline(rows) -> list[dict]:
    """The ratios issue 33 sets targets on, each baseline's time over memr1's (above 1: memr1 faster).
    grpo_advantage per size and case, mode-matched: verl's vectorised form over memr1's `auto` path, eager
    over eager and compiled over compiled (target 1.0 compiled); the mixed-mode ratios ride along in
    `mixed`, never as a headline. gae: the per-row numba loop over memr1's path (target 1.5 at 256x1024
    and 1024x2048; numba's prange loop instead when torch has several threads), with the share of the
    bandwidth floor memr1 reaches (target 0.5), the time-major numba loop and scipy's lfilter. logprobs: TRL's chunked function over memr1's, in time (target 1.0) and peak memory."""
    out, cells = [], {}
    for r in rows:
        if r["ms"] is not None:
            cells.setdefault((r["kernel"], str(r["size"]), r.get("case")), {})[r["impl"]] = r
    for (kernel, size, case), got in cells.items():
        ms = {k: r["ms"] for k, r in got.items()}
        eager, compiled = base_impl(ms, compiled=False), base_impl(ms, compiled=True)

        def entry(name, theirs, ours, target=None, key="ms", **extra):
            if theirs in got and ours in got:
                out.append(headline_entry(f"{kernel} {size}{' ' + case if case else ''}: {name}",
                                          got[theirs][key] / got[ours][key], f"{ours} {size}", f"{theirs} {size}",
                                          f"{theirs}'s {key} over {ours}'s", target=target, **extra))
        if kernel == "grpo_advantage":
            best = min(v for k, v in ms.items() if k.startswith("memr1"))
            entry("eager", "verl_vectorised", eager)
            entry("compiled", "verl_vectorised_compiled", compiled, target=1.0, mixed={
                "best_vs_best": min(ms["verl_vectorised"], ms["verl_vectorised_compiled"]) / best,
                "eager_vs_memr1_best": ms["verl_vectorised"] / best,
                "compiled_vs_memr1_best": ms["verl_vectorised_compiled"] / best,
                "torch_reference_eager": ms["verl_vectorised"] / ms["memr1_torch"],
                "torch_reference_compiled": ms["verl_vectorised_compiled"] / ms["memr1_torch_compiled"]})
        elif kernel == "gae":
            target = 1.5 if size in GAE_TARGET_SIZES else None
            numba_row = "numba_prange" if "numba_prange" in got else "numba_loop"
            floor = {}
            if "stream_copy" in got and eager in got:
                floor = {"floor_ms": ms["stream_copy"], "floor_share": ms["stream_copy"] / ms[eager],
                         "floor_bytes": got["stream_copy"]["bytes"]}
            entry("over the numba loop", numba_row, eager, target=target, **floor)
            if floor:
                out.append(headline_entry(
                    f"gae {size}: share of the bandwidth floor", floor["floor_share"], f"{eager} {size}",
                    f"stream_copy {size}", f"a copy of the {floor['floor_bytes']} bytes GAE moves at the least, "
                    f"its ms over {eager}'s", unit="share", target=0.5 if target else None))
            entry("over the time-major numba loop", "numba_time_major", eager)
            entry("over scipy lfilter", "scipy_lfilter", eager)
        elif kernel == "logprobs":
            entry("time over TRL's chunked", "trl_chunked", eager, target=1.0)
            entry("peak memory over TRL's chunked", "trl_chunked", eager, target=1.0, key="peak_mb")
    return out


# ----------------------------------------------------------------------------- gae
GAE_SIZES = ((64, 256), (256, 1024), (1024, 2048))  # quick runs stop at 256x1024
GAE_TARGET_SIZES = ("256x1024", "1024x2048")  # where issue 64 sets its targets


def pin_malloc() -> str:
    """Fix glibc's malloc thresholds for the GAE rows: by default they move with what was freed last,
    and a heap trimmed after one impl's free hands the next impl fresh pages, a page fault per 4 KB of
    output (several ms at 1024x2048), so a row's time would depend on the row before it. Pinned, every
    impl reuses freed memory, as a trainer's long-running process does once its allocator has settled."""
    import ctypes
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(-3, 32 << 20) and libc.mallopt(-1, 1 << 30)  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        ok = False
    return "glibc mallopt: mmap threshold 32 MiB, trim threshold 1 GiB" if ok else "allocator defaults"


def bench_gae(device, quick, rows, sizes=None):
    """memr1's GAE against numba loops (per row, the headline baseline; rows under prange when torch has
    several threads; time-major), verl's batched loop eager and with its body compiled, scipy's filter;
    and a copy of the bytes GAE must move at the least (`stream_copy`: the bandwidth floor)."""
    threads = torch.get_num_threads()
    malloc = pin_malloc() if device == "cpu" else None
    if device == "cpu" and threads > 1:
        import numba
        numba.set_num_threads(threads)
    for n, T in sizes or (GAE_SIZES[:2] if quick else GAE_SIZES):
        g = torch.Generator().manual_seed(T)
        r = torch.randn(n, T, generator=g, dtype=torch.float64).float()
        v = torch.randn(n, T + 1, generator=g, dtype=torch.float64).float()
        m = torch.arange(T)[None, :] < torch.randint(1, T + 1, (n,), generator=g)[:, None]
        m[:, T // 3] = False  # a masked gap inside every response (tool output)
        truth = torch.tensor(base.gae_truth(r.double().tolist(), v.double().tolist(), m.tolist(), 0.99, 0.95),
                             dtype=torch.float64)
        rd, vd, md = r.to(device), v.to(device), m.to(device)
        impls = {"memr1_torch": lambda: gae(rd, vd, md, 0.99, 0.95, impl="torch"),
                 "batched_loop": lambda: base.gae_batched(rd, vd, md, 0.99, 0.95),
                 "batched_loop_compiled": lambda: base.gae_batched_compiled(rd, vd, md, 0.99, 0.95)}
        floor = {}
        if device == "cpu":  # scipy and numba take numpy arrays
            impls["scipy_lfilter"] = lambda: base.gae_lfilter(rd, vd, md, 0.99, 0.95)
            impls["numba_loop"] = lambda: base.gae_numba(rd, vd, md, 0.99, 0.95)
            impls["numba_time_major"] = lambda: base.gae_numba(rd, vd, md, 0.99, 0.95, "time_major")
            if threads > 1:
                impls["numba_prange"] = lambda: base.gae_numba(rd, vd, md, 0.99, 0.95, "row_parallel")
            # The floor: read half the bytes, write the other half, on as many threads as memr1 gets
            # (torch's copy_ splits a large copy over its intra-op threads).
            floor["bytes"] = base.gae_bytes(n, T)
            src = torch.ones(floor["bytes"] // 2, dtype=torch.uint8)
            dst = torch.empty_like(src)
            impls["stream_copy"] = lambda: (dst.copy_(src), None)
        if device == "cuda" and triton_available():
            impls["memr1_triton"] = lambda: gae(rd, vd, md, 0.99, 0.95, impl="triton")
        if device == "cpu" and native_available():
            impls["memr1_native"] = lambda: gae(rd, vd, md, 0.99, 0.95, impl="native")
        # Every side is checked before any is timed: the same outputs, to float32 rounding.
        ours = gae(rd, vd, md, 0.99, 0.95)
        for name, fn in impls.items():
            if name != "stream_copy":
                adv, ret = fn()
                for got, want in ((adv, ours[0]), (ret, ours[1])):
                    if not torch.allclose(got.double().cpu(), want.double().cpu(), rtol=1e-4, atol=1e-4):
                        raise AssertionError(f"gae {n}x{T}: {name}'s outputs differ from memr1's")
        outs, ms, _ = measure(impls, device, 10)
        for impl in impls:
            row = {"kernel": "gae", "impl": impl, "size": f"{n}x{T}", "device": device, "ms": ms[impl]}
            if impl == "stream_copy":
                row.update(max_abs_err=None, bytes=floor["bytes"], gbps=round(floor["bytes"] / ms[impl] / 1e6, 2))
            else:
                row["max_abs_err"] = max((outs[impl][0].double().cpu() - truth).abs().max().item(),
                                         (outs[impl][1].double().cpu() - torch.where(m, truth + v[:, :T].double(), 0.0))
                                         .abs().max().item())
            if malloc:
                row["malloc"] = malloc
            rows.append(row)
            print_row(row)


# ----------------------------------------------------------------------------- logprobs
def bench_logprobs(device, quick, rows, rounds, shape=None):
    """Each round runs every impl once in its own process, in a new random order; a row is the median
    over rounds of each run's median ms (and of its peak memory). `shape`: (B, T, H, V) instead of the
    default sizes."""
    b, t, h, v = shape or ((2, 1024, 576, 49152) if quick else (8, 1024, 576, 49152))
    impls = ["naive", "trl_selective_log_softmax", "trl_chunked", "memr1_torch"] + (
        ["memr1_triton"] if device == "cuda" else [])
    hidden, weight, targets = base.logprob_inputs(b * t, h, v)
    truth = dict(zip(("lp", "gh", "gw"), base.logprobs_truth64(hidden, weight, targets)))
    runs, order = {impl: [] for impl in impls}, random.Random(1)
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            names = list(impls)
            order.shuffle(names)
            for impl in names:
                path = os.path.join(tmp, impl + ".pt")
                subprocess.run([sys.executable, "-m", "memr1.bench.logprobs_worker", impl,
                                "--threads", str(torch.get_num_threads()),
                                "--shape", f"{b},{t},{h},{v}", "--device", device, "--out", path], check=True)
                runs[impl].append(torch.load(path))
    for impl in impls:
        res = runs[impl]
        row = {"kernel": "logprobs", "impl": impl, "size": f"B{b}xT{t}xV{v}xH{h}", "device": device}
        if "skipped" in res[0]:
            row.update(skipped=res[0]["skipped"], ms=None, max_abs_err=None)
        else:
            row.update(ms=statistics.median(r["ms"] for r in res), ms_runs=[round(r["ms"], 2) for r in res],
                       max_abs_err=max((r[k].double() - truth[k]).abs().max().item() for r in res for k in truth),
                       peak_mb=round(statistics.median(r["peak_mb"] for r in res), 1), rounds=len(res),
                       peak_method="cuda max_memory_allocated" if device == "cuda" else "VmHWM - VmRSS")
        rows.append(row)
        print_row(row)


# ----------------------------------------------------------------------------- report
HEADER = (f"{'kernel':<15} {'impl':<26} {'size':<20} {'case':<8} {'ms':>10} {'x memr1':>8}"
          f" {'max_abs_err':>11} {'peak_mb':>8} {'peak x':>7}")


def print_row(r):
    ms = "skipped" if r["ms"] is None else f"{r['ms']:.3f}"
    err = "-" if r["max_abs_err"] is None else f"{r['max_abs_err']:.2e}"
    print(f"{r['kernel']:<15} {r['impl']:<26} {str(r['size']):<20} {r.get('case') or '':<8}"
          f" {ms:>10} {r.get('ms_vs_memr1', '-'):>8} {err:>11}"
          f" {r.get('peak_mb', '-'):>8} {r.get('peak_vs_memr1', '-'):>7}", flush=True)


def add_ratios(rows):
    """ms (and peak) of each row over memr1's in its (kernel, size, case, device) group: compiled rows
    over memr1's compiled row, the rest over memr1's eager row (the path `auto` takes: Triton on CUDA,
    the C++ loop on CPU where the kernel has one, else the torch reference)."""
    key = lambda r: (r["kernel"], str(r["size"]), r.get("case"), r["device"])  # noqa: E731
    groups = {}
    for r in rows:
        groups.setdefault(key(r), {})[r["impl"]] = r
    for r in rows:
        group = groups[key(r)]
        base_row = group.get(base_impl(group, compiled=r["impl"].endswith("compiled")))
        if base_row and base_row["ms"] and r["ms"] is not None:
            r["ms_vs_memr1"] = round(r["ms"] / base_row["ms"], 2)
        if base_row and r.get("peak_mb") and base_row.get("peak_mb"):
            r["peak_vs_memr1"] = round(r["peak_mb"] / base_row["peak_mb"], 3)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m memr1.bench.kernels", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="sizes up to 64k, GAE up to 256x1024, B=2 log-probs")
    p.add_argument("--json", default=None, help="write {bench, machine, rows, headline, settings} here")
    p.add_argument("--only", default="grpo,gae,logprobs")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for this run")
    p.add_argument("--logprob-rounds", type=int, default=None,
                   help="rounds of log-prob worker runs, each impl once per round in a new order (default 5; --quick 1)")
    p.add_argument("--logprob-shape", type=lambda x: tuple(int(n) for n in x.split(",")), default=None,
                   help="B,T,H,V of the log-prob runs (default 8,1024,576,49152; --quick B=2)")
    p.add_argument("--gae-sizes", type=lambda x: [tuple(int(k) for k in s.split("x")) for s in x.split(",")],
                   default=None, help="NxT,... of the GAE rows instead of the default sizes")
    args = p.parse_args(argv)
    if args.logprob_rounds is None:
        args.logprob_rounds = 1 if args.quick else 5
    if args.threads:
        torch.set_num_threads(args.threads)
    torch._logging.set_logs(dynamo=logging.ERROR)
    rows = []
    parts = {"grpo": bench_grpo, "gae": lambda *a: bench_gae(*a, sizes=args.gae_sizes),
             "logprobs": lambda *a: bench_logprobs(*a, rounds=args.logprob_rounds, shape=args.logprob_shape)}
    print(HEADER)
    for name in args.only.split(","):
        parts[name](args.device, args.quick, rows)
    add_ratios(rows)
    print("\n" + HEADER)
    for r in rows:
        print_row(r)
    print("x memr1 / peak x: this row's ms / peak_mb over memr1's in the same group, compiled rows over memr1's "
          "compiled row (above 1: memr1 is faster / smaller)")
    heads = headline(rows)
    for h in heads:
        print(f"headline {h['name']}: {h['what']} = {h['value']:.2f}"
              + (f" (mixed modes: best vs best {h['mixed']['best_vs_best']:.2f})" if "mixed" in h else ""))
    if args.json:
        write_json(args.json, "kernels", rows, headline=heads, settings={
            "quick": args.quick, "only": args.only, "device": args.device, "threads": torch.get_num_threads(),
            "group": GROUP, "eps": base.EPS, "std": "unbiased", "min_calls": MIN_CALLS,
            "grpo_rounds": {n: grpo_rounds(n) for n in GRPO_SIZES}, "gae_gamma_lam": [0.99, 0.95],
            "gae_sizes": [f"{n}x{T}" for n, T in args.gae_sizes or (GAE_SIZES[:2] if args.quick else GAE_SIZES)],
            "logprob_rounds": args.logprob_rounds,
            "compile": "torch.compile(dynamic=True), one for all sizes"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
