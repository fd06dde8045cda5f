"""bench.kernels' logprobs section.

logprobs: forward + backward of sum(log-probs) of a [M, 576] x [49152, 576] head: memr1's chunked
path against the naive path (log_softmax of the full logits, gather), TRL's selective_log_softmax over
full logits, and TRL's chunked log-prob function, the one its GRPO trainer calls through its fused LM
head (`trl_chunked`, log-probs only; TRL rows are skipped when TRL is not installed); errors of the
log-probs and both gradients against float64. Each impl runs in a fresh process
(bench/logprobs_worker.py), once per round, in a new random order each round (--logprob-rounds, 5 by
default); rows are medians over the rounds. Peak memory is the rise of the process's peak RSS (VmHWM)
over its RSS before the first call (CUDA: max_memory_allocated over the allocation before).
"""
import os
import random
import statistics
import subprocess
import sys
import tempfile

import torch

from memr1.bench import kernel_baselines as base
from memr1.bench.kernel_timing import print_row


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
