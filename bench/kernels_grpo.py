"""bench.kernels' grpo_advantage section.

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
"""
import torch

from memr1.bench import kernel_baselines as base
from memr1.bench.kernel_timing import measure, print_row
from memr1.kernels import grpo_advantage
from memr1.kernels._dispatch import native_available, triton_available

GROUP = 8
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
