"""Kernel benchmark: grpo_advantage, gae and logprobs against what a competent user would run instead.

    python -m memr1.bench.kernels [--quick] [--threads N] [--only grpo,gae,logprobs] --json PATH

Sections, one module each: bench/kernels_grpo.py (grpo_advantage, the headline), kernels_gae.py and
kernels_logprobs.py, each saying what it compares; bench/kernel_timing.py says how rows are timed.
This module runs them and takes the ratios: `headline` in the JSON gives the baseline's time over
memr1's (above 1: memr1 is faster), mode-matched for grpo_advantage.
"""
import argparse
import logging
import sys

import torch

from memr1.bench import kernel_baselines as base
from memr1.bench.common import headline_entry, write_json
from memr1.bench.kernel_timing import HEADER, MIN_CALLS, print_row
from memr1.bench.kernels_gae import GAE_SIZES, GAE_TARGET_SIZES, bench_gae
from memr1.bench.kernels_grpo import GROUP, GRPO_SIZES, bench_grpo, grpo_rounds
from memr1.bench.kernels_logprobs import bench_logprobs


# memr1's row that the ratios are taken against, first present wins: the path `auto` runs (Triton on
# CUDA, the C++ loop on CPU where the kernel has one), else the torch reference.
EAGER_BASE = ("memr1_triton", "memr1_native", "memr1_torch")
COMPILED_BASE = ("memr1_native_compiled", "memr1_torch_compiled")


def base_impl(impls, compiled: bool):
    """The name in `impls` (a collection of impl names) that memr1's ratios are taken against, or None."""
    return next((i for i in (COMPILED_BASE if compiled else EAGER_BASE) if i in impls), None)


def headline(rows) -> list[dict]:
    """The ratios the targets are set on, each baseline's time over memr1's (above 1: memr1 faster).
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
