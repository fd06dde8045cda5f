"""One log-prob impl of bench.kernels in its own process, so that its peak memory is its own.

    python -m memr1.bench.logprobs_worker IMPL --shape B,T,H,V --device cpu|cuda --threads N --out PATH

IMPL: naive, trl_selective_log_softmax, trl_chunked, memr1_torch or memr1_triton. It times forward + backward of
sum(log-probs) of a [B*T, H] x [V, H] head: the peak memory of the first call (CPU: the rise of VmHWM
over VmRSS before it; CUDA: max_memory_allocated over the allocation before), then the median of
bench.kernel_timing.MIN_CALLS more, and saves {lp, gh, gw, peak_mb, ms} (or {skipped}) to PATH with
torch.save for the parent to check against its float64 reference.
"""
import argparse
import statistics
import sys
import time

import torch

from memr1.bench import kernel_baselines as base
from memr1.bench.common import status_mb
from memr1.bench.kernel_timing import MIN_CALLS, cuda_ms
from memr1.kernels import logprobs


def run(impl, rows, m, h, v, device, out_path):
    hidden, weight, targets = base.logprob_inputs(m, h, v, device)
    hidden.requires_grad_()
    weight.requires_grad_()
    if impl.startswith("trl_"):
        fn = base.trl_selective_log_softmax() if impl == "trl_selective_log_softmax" else base.trl_chunked_logprob()
        if fn is None:
            torch.save({"skipped": "trl is not installed"}, out_path)
            return
        if impl == "trl_selective_log_softmax":
            forward = lambda: base.logprobs_trl(hidden, weight, targets, rows, fn)  # noqa: E731
        else:
            forward = lambda: fn(hidden, weight, targets)  # noqa: E731
    elif impl == "naive":
        forward = lambda: base.logprobs_naive(hidden, weight, targets)  # noqa: E731
    else:
        forward = lambda: logprobs(hidden, weight, targets, impl=impl.split("_")[1])  # noqa: E731

    def step():
        hidden.grad = weight.grad = None
        lp = forward()
        lp.sum().backward()
        return lp

    if device == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        lp = step()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - before) / 2**20
        ms = cuda_ms(step)
    else:
        before = status_mb("VmRSS")
        lp = step()
        peak = status_mb("VmHWM") - before
        times = []
        for _ in range(MIN_CALLS):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        ms = statistics.median(times) * 1e3
    torch.save({"lp": lp.detach().cpu(), "gh": hidden.grad.cpu(), "gw": weight.grad.cpu(),
                "peak_mb": peak, "ms": ms}, out_path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m memr1.bench.logprobs_worker", description=__doc__.split("\n")[0])
    p.add_argument("impl")
    p.add_argument("--shape", required=True, help="B,T,H,V")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    b, t, h, v = (int(x) for x in args.shape.split(","))
    run(args.impl, b, b * t, h, v, args.device, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
