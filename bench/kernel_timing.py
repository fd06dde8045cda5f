"""How bench.kernels times and prints its rows (its sections: kernels_grpo, kernels_gae,
kernels_logprobs).

Times are medians of at least 5 calls after one untimed call (CUDA: triton.testing.do_bench); on CPU
the calls run in interleaved rounds, each in a fresh (seeded) random order, so that load from other
work hits every impl alike and no impl always runs right after another on warm inputs. On a shared
CPU, --threads 1 avoids OpenMP stalls that otherwise swamp the small ops.
"""
import random
import statistics
import time

import torch

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


HEADER = (f"{'kernel':<15} {'impl':<26} {'size':<20} {'case':<8} {'ms':>10} {'x memr1':>8}"
          f" {'max_abs_err':>11} {'peak_mb':>8} {'peak x':>7}")


def print_row(r):
    ms = "skipped" if r["ms"] is None else f"{r['ms']:.3f}"
    err = "-" if r["max_abs_err"] is None else f"{r['max_abs_err']:.2e}"
    print(f"{r['kernel']:<15} {r['impl']:<26} {str(r['size']):<20} {r.get('case') or '':<8}"
          f" {ms:>10} {r.get('ms_vs_memr1', '-'):>8} {err:>11}"
          f" {r.get('peak_mb', '-'):>8} {r.get('peak_vs_memr1', '-'):>7}", flush=True)
