"""Kernel benchmark: grpo_advantage, gae and logprobs against the baselines peers use.

    python -m memr1.bench.kernels [--quick] [--threads N] [--only grpo,gae,logprobs] --json PATH

grpo_advantage: our torch reference (and the Triton kernels on CUDA) against two rewrites of verl's
methods (a Python loop over a dict of groups; a vectorised version with three index_add_ calls, the
sum-of-squares variance and its host syncs, also under torch.compile) and a dense view(-1, 8). All use
the unbiased std with eps 1e-6. Errors are against a float64 two-pass truth, on U(0,1) rewards and on
1e4 + U(0,1). gae: the torch reference (and Triton on CUDA) against a scalar Python loop.
logprobs: forward + backward of the chunked path against the naive log_softmax path. On CPU each impl
runs in a fresh subprocess and peak memory is the rise of the process's peak RSS (VmHWM in
/proc/self/status) over its RSS just before the call; on CUDA it is torch.cuda.max_memory_allocated
over the allocation before the call. Times are medians (triton.testing.do_bench on CUDA). On a
shared CPU, --threads 1 avoids OpenMP stalls that otherwise swamp the small ops.
"""
import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from memr1.bench.common import write_json
from memr1.kernels import gae, grpo_advantage, logprobs, logprobs_ref
from memr1.kernels._dispatch import triton_available

EPS = 1e-6


def cuda_ms(fn):
    import triton.testing
    return float(triton.testing.do_bench(fn, return_mode="median"))


def measure(impls, device, repeat, slow=()):
    """Outputs and first-call seconds of each impl, then median ms. On CPU the timed calls run in
    interleaved rounds, so load from other work on a shared machine hits every impl alike; the
    `slow` ones (Python loops, seconds per call) report their one first call."""
    outs, first, ms = {}, {}, {}
    for name, fn in impls.items():
        t0 = time.perf_counter()
        outs[name] = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        first[name] = time.perf_counter() - t0
    fast = [name for name in impls if name not in slow]
    if device == "cuda":
        ms = {name: cuda_ms(impls[name]) for name in fast}
    else:
        times = {name: [] for name in fast}
        for _ in range(repeat):
            for name in fast:
                t0 = time.perf_counter()
                impls[name]()
                times[name].append(time.perf_counter() - t0)
        ms = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
    ms.update({name: first[name] * 1e3 for name in slow if name in impls})
    return outs, ms, first


# ----------------------------------------------------------------------------- grpo baselines
def verl_loop(scores, index):
    """verl's per-group loop, rewritten: dict of groups, size-1 group -> mean 0 / std 1."""
    scores = scores.clone()
    members = {}
    for i in range(scores.shape[0]):
        members.setdefault(index[i], []).append(scores[i])
    mean, std = {}, {}
    for key, vals in members.items():
        if len(vals) == 1:
            mean[key], std[key] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            stacked = torch.stack(vals)
            mean[key], std[key] = stacked.mean(), stacked.std()
    for i in range(scores.shape[0]):
        scores[i] = (scores[i] - mean[index[i]]) / (std[index[i]] + EPS)
    return scores


def verl_index_add(scores, gid):
    """verl's vectorised variant, rewritten: three index_add_, E[x^2] - E[x]^2, host syncs."""
    num = int(gid.max().item()) + 1
    cnt = torch.zeros(num, dtype=scores.dtype, device=scores.device).index_add_(
        0, gid, torch.ones_like(scores))
    s1 = torch.zeros_like(cnt).index_add_(0, gid, scores)
    s2 = torch.zeros_like(cnt).index_add_(0, gid, scores * scores)
    if torch.any(cnt == 0):  # the real one checks for empty groups, syncing again
        cnt = cnt.clamp(min=1)
    mean = s1 / cnt
    var = (s2 - s1 * mean) / (cnt - 1).clamp(min=1)
    single = cnt == 1
    mean = torch.where(single, 0.0, mean)
    std = torch.where(single, 1.0, var.clamp(min=0).sqrt())
    return (scores - mean[gid]) / (std[gid] + EPS)


def dense_view(scores, group=8):
    """Equal, contiguous groups only (OpenRLHF / TRL style)."""
    s = scores.view(-1, group)
    return ((s - s.mean(1, keepdim=True)) / (s.std(1, keepdim=True) + EPS)).view(-1)


def bench_grpo(device, quick, rows):
    sizes = [1024, 65536, 1 << 20]
    compiled = torch.compile(verl_index_add, dynamic=True)
    for n in sizes:
        g = torch.Generator().manual_seed(n)
        gid = torch.randperm(n, generator=g) // 8  # groups of 8, members scattered
        order = torch.argsort(gid, stable=True)  # the contiguous layout dense_view needs
        for label, offset in (("U(0,1)", 0.0), ("1e4+U(0,1)", 1e4)):
            r = (offset + torch.rand(n, generator=g, dtype=torch.float64)).float()
            # float64 two-pass truth on the very fp32 inputs every impl sees
            truth = dense_view(r.double()[order])[torch.argsort(order)]
            r_dense = r[order].to(device)  # laid out before timing: a dense trainer has it so
            r, gd = r.to(device), gid.to(device)
            impls = {
                "memr1_torch": lambda: grpo_advantage(r, gd, n // 8, impl="torch")[0],
                "verl_index_add": lambda: verl_index_add(r, gd),
                "verl_index_add_compiled": lambda: compiled(r, gd),
                "dense_view": lambda: dense_view(r_dense),
            }
            if device == "cuda" and triton_available():
                impls["memr1_triton"] = lambda: grpo_advantage(r, gd, n // 8, impl="triton")[0]
            if n <= 65536 or (not quick and label == "U(0,1)"):  # seconds per call at 1M
                idx = gid.tolist()
                impls["verl_loop"] = lambda: verl_loop(r, idx)
            outs, ms, first = measure(impls, device, 9 if n > 65536 else 20, slow=("verl_loop",))
            for impl in impls:
                want = truth[order] if impl == "dense_view" else truth
                err = (outs[impl].double().cpu() - want).abs().max().item()
                row = {"kernel": "grpo_advantage", "impl": impl, "size": n, "rewards": label,
                       "device": device, "ms": ms[impl], "max_abs_err": err}
                if impl == "verl_index_add_compiled":
                    row["first_call_s"] = round(first[impl], 2)
                rows.append(row)
                print_row(row)


# ----------------------------------------------------------------------------- gae
def python_gae(r, v, m, gamma, lam):
    """Scalar reference over plain lists (values [N, T+1])."""
    adv = []
    for ri, vi, mi in zip(r, v, m):
        a, next_v, run = [0.0] * len(ri), vi[-1], 0.0
        for t in range(len(ri) - 1, -1, -1):
            if mi[t]:
                run = ri[t] + gamma * next_v - vi[t] + gamma * lam * run
                next_v, a[t] = vi[t], run
        adv.append(a)
    return adv


def bench_gae(device, quick, rows):
    for n, T in ([(64, 256)] if quick else [(64, 256), (256, 1024)]):
        g = torch.Generator().manual_seed(T)
        r = torch.randn(n, T, generator=g, dtype=torch.float64)
        v = torch.randn(n, T + 1, generator=g, dtype=torch.float64)
        m = torch.arange(T)[None, :] < torch.randint(1, T + 1, (n,), generator=g)[:, None]
        truth = torch.tensor(python_gae(r.tolist(), v.tolist(), m.tolist(), 0.99, 0.95))
        rd, vd, md = r.float().to(device), v.float().to(device), m.to(device)
        rl, vl, ml = rd.cpu().tolist(), vd.cpu().tolist(), md.cpu().tolist()
        impls = {"memr1_torch": lambda: gae(rd, vd, md, 0.99, 0.95, impl="torch")[0],
                 "naive": lambda: torch.tensor(python_gae(rl, vl, ml, 0.99, 0.95))}
        if device == "cuda" and triton_available():
            impls["memr1_triton"] = lambda: gae(rd, vd, md, 0.99, 0.95, impl="triton")[0]
        outs, ms, _ = measure(impls, device, 5, slow=("naive",))
        for impl in impls:
            err = (outs[impl].double().cpu() - truth).abs().max().item()
            row = {"kernel": "gae", "impl": impl, "size": f"{n}x{T}", "device": device,
                   "ms": ms[impl], "max_abs_err": err}
            rows.append(row)
            print_row(row)


# ----------------------------------------------------------------------------- logprobs
def rss_mb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def logprobs_child(impl, m, h, v, device, out_path):
    """One impl in this process: peak memory of the first forward+backward, time of the second."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(m, h, generator=g).to(device).requires_grad_()
    weight = (torch.randn(v, h, generator=g) * 0.05).to(device).requires_grad_()
    targets = torch.randint(0, v, (m,), generator=g).to(device)

    def step():
        hidden.grad = weight.grad = None
        if impl == "naive":
            lp = logprobs_ref(hidden, weight, targets)
        else:
            lp = logprobs(hidden, weight, targets, impl=impl.split("_")[1])
        lp.sum().backward()
        return lp

    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        lp = step()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        base = rss_mb("VmRSS")
        lp = step()
        peak = rss_mb("VmHWM") - base
    if device == "cuda":
        ms = cuda_ms(step)
    else:  # seconds per call: one more call, timed alone
        t0 = time.perf_counter()
        step()
        ms = (time.perf_counter() - t0) * 1e3
    torch.save({"lp": lp.detach().cpu(), "gh": hidden.grad.cpu(), "gw": weight.grad.cpu(),
                "peak_mb": peak, "ms": ms}, out_path)


def bench_logprobs(device, quick, rows):
    b, t, v, h = (2, 1024, 49152, 576) if quick else (8, 1024, 49152, 576)
    impls = ["naive", "memr1_torch"] + (["memr1_triton"] if device == "cuda" else [])
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for impl in impls:
            path = os.path.join(tmp, impl + ".pt")
            subprocess.run([sys.executable, "-m", "memr1.bench.kernels", "--logprobs-child", impl,
                            "--threads", str(torch.get_num_threads()),
                            "--shape", f"{b * t},{h},{v}", "--device", device, "--out", path],
                           check=True)
            results[impl] = torch.load(path)
    ref = results["naive"]
    for impl in impls:
        res = results[impl]
        err = max((res[k].double() - ref[k].double()).abs().max().item() for k in ("lp", "gh", "gw"))
        row = {"kernel": "logprobs", "impl": impl, "size": f"B{b}xT{t}xV{v}xH{h}", "device": device,
               "ms": res["ms"], "max_abs_err": err, "peak_mb": round(res["peak_mb"], 1),
               "peak_method": "cuda max_memory_allocated" if device == "cuda" else "VmHWM - VmRSS"}
        rows.append(row)
        print_row(row)


# ----------------------------------------------------------------------------- report
HEADER = (f"{'kernel':<15} {'impl':<24} {'size':<20} {'rewards':<11} {'ms':>10} {'x memr1':>8}"
          f" {'max_abs_err':>11} {'peak_mb':>8} {'peak x':>7}")


def print_row(r):
    print(f"{r['kernel']:<15} {r['impl']:<24} {str(r['size']):<20} {r.get('rewards') or '':<11}"
          f" {r['ms']:>10.3f} {r.get('ms_vs_memr1', '-'):>8} {r['max_abs_err']:>11.2e}"
          f" {r.get('peak_mb', '-'):>8} {r.get('peak_vs_memr1', '-'):>7}", flush=True)


def add_ratios(rows):
    """ms (and peak) of each row over memr1's in its (kernel, size, rewards, device) group; memr1's
    Triton row is the base where there is one."""
    key = lambda r: (r["kernel"], str(r["size"]), r.get("rewards"), r["device"])  # noqa: E731
    ours = {}
    for r in rows:
        if r["impl"] == "memr1_triton" or (r["impl"] == "memr1_torch" and key(r) not in ours):
            ours[key(r)] = r
    for r in rows:
        base = ours.get(key(r))
        if base and base["ms"]:
            r["ms_vs_memr1"] = round(r["ms"] / base["ms"], 2)
        if base and "peak_mb" in r and base.get("peak_mb"):
            r["peak_vs_memr1"] = round(r["peak_mb"] / base["peak_mb"], 3)


def print_table(rows):
    print("\n" + HEADER)
    for r in rows:
        print_row(r)
    print("x memr1 / peak x: this row's ms / peak_mb over memr1's in the same group "
          "(above 1: memr1 is faster / smaller)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m memr1.bench.kernels", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller sizes; skip the loop at N=1M")
    p.add_argument("--json", default=None, help="write {bench, machine, rows} here")
    p.add_argument("--only", default="grpo,gae,logprobs")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for this run")
    p.add_argument("--logprobs-child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--shape", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch._logging.set_logs(dynamo=logging.ERROR)  # verl's .item() graph breaks are expected
    if args.logprobs_child:
        m, h, v = (int(x) for x in args.shape.split(","))
        logprobs_child(args.logprobs_child, m, h, v, args.device, args.out)
        return 0
    rows = []
    parts = {"grpo": bench_grpo, "gae": bench_gae, "logprobs": bench_logprobs}
    print(HEADER)
    for name in args.only.split(","):
        parts[name](args.device, args.quick, rows)
    add_ratios(rows)
    print_table(rows)
    if args.json:
        write_json(args.json, "kernels", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
