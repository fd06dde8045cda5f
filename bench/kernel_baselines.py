"""What bench.kernels compares memr1's kernels with: the baselines a competent user would write, each
from the method it names (no code copied), and the float64 references the errors are taken against."""
from __future__ import annotations

import numpy as np
import torch

EPS = 1e-6


# ----------------------------------------------------------------------------- GRPO advantages
def verl_vectorised(scores, gid, num_groups: int, eps: float = EPS):
    """verl's vectorised GRPO advantages (compute_grpo_vectorized_outcome_advantage over its
    group_mean_std): per-group count, sum and sum of squares by index_add_, the unbiased variance as
    (sum2 - sum^2 / count) / (count - 1) floored at eps, a singleton group taking mean 0 and std 1, then
    (r - mean) / (std + eps). Two changes, both in its favour: the group count is passed in rather than
    read from gid.max() (a host sync), and singletons go through torch.where rather than a synced `if`,
    so that torch.compile sees a single graph."""
    r = scores.float()
    cnt = r.new_zeros(num_groups).index_add_(0, gid, torch.ones_like(r))
    s1 = r.new_zeros(num_groups).index_add_(0, gid, r)
    s2 = r.new_zeros(num_groups).index_add_(0, gid, r * r)
    mean = s1 / cnt.clamp(min=1)
    var = (s2 - s1 * mean) / (cnt - 1).clamp(min=1)
    single = cnt <= 1
    mean = torch.where(single, 0.0, mean)
    std = torch.where(single, 1.0, var.clamp(min=eps).sqrt())
    return (r - mean[gid]) / (std[gid] + eps)


def verl_loop(scores, index: list[int], eps: float = EPS):
    """verl's original per-group Python loop (a dict of member lists), kept for reference only: verl
    itself has moved to the vectorised form above."""
    out = scores.clone()
    members: dict[int, list] = {}
    for i, g in enumerate(index):
        members.setdefault(g, []).append(scores[i])
    stats = {}
    for g, vals in members.items():
        x = torch.stack(vals)
        stats[g] = (torch.tensor(0.0), torch.tensor(1.0)) if len(vals) == 1 else (x.mean(), x.std())
    for i, g in enumerate(index):
        out[i] = (scores[i] - stats[g][0]) / (stats[g][1] + eps)
    return out


def dense_view(scores, group: int = 8, eps: float = EPS):
    """Equal, contiguous groups only (OpenRLHF / TRL style): a [G, group] view and row statistics."""
    s = scores.view(-1, group)
    return ((s - s.mean(1, keepdim=True)) / (s.std(1, keepdim=True) + eps)).view(-1)


def grpo_truth64(rewards, gid, group: int, eps: float = EPS):
    """Two-pass float64 advantages of the given (fp32) rewards: members gathered by a stable sort."""
    order = torch.argsort(gid, stable=True)
    dense = dense_view(rewards.double()[order], group, eps)
    return torch.empty_like(dense).index_copy_(0, order, dense)


# ----------------------------------------------------------------------------- GAE
def _gae_step(r_t, v_t, m_t, run, nxt, gamma: float, lam: float):
    step = r_t + gamma * nxt - v_t + gamma * lam * run
    return torch.where(m_t, step, run), torch.where(m_t, v_t, nxt)


def gae_batched(r, v, m, gamma: float, lam: float, step=_gae_step):
    """GAE vectorised over the batch with a loop over time only, as verl's compute_gae_advantage_return
    is, on memr1's semantics: values [N, T+1] (column T bootstraps), a masked step leaves the running
    advantage and the next value untouched, outputs are 0 where the mask is 0. Time-major copies make
    each step's slice contiguous. Returns (advantages, returns), both [N, T]."""
    n, T = r.shape
    rt, vt, mt = r.T.contiguous(), v.T.contiguous(), m.T.contiguous()
    adv = torch.empty_like(rt)
    run = torch.zeros(n, dtype=r.dtype, device=r.device)
    nxt = vt[T].clone()
    for t in range(T - 1, -1, -1):
        run, nxt = step(rt[t], vt[t], mt[t], run, nxt, gamma, lam)
        adv[t] = run
    adv = torch.where(mt, adv, 0.0).T
    return adv, torch.where(m, adv + v[:, :T], 0.0)


_gae_step_compiled = None


def gae_batched_compiled(r, v, m, gamma: float, lam: float):
    """gae_batched with its loop body compiled (torch.compile fuses the step's five element-wise ops into
    one kernel); the loop over time stays in Python, since compiling it whole unrolls T steps."""
    global _gae_step_compiled
    if _gae_step_compiled is None:
        _gae_step_compiled = torch.compile(_gae_step, dynamic=False)
    return gae_batched(r, v, m, gamma, lam, _gae_step_compiled)


def gae_lfilter(r, v, m, gamma: float, lam: float):
    """GAE as a discounted sum per sequence with scipy.signal.lfilter (CPU tensors): the masked-in steps
    of a row, their TD errors against the next masked-in value (the bootstrap column after the last),
    filtered backwards with the pole gamma * lam."""
    from scipy.signal import lfilter
    rn, vn, mn = r.numpy(), v.numpy(), m.numpy()
    n, T = rn.shape
    adv = np.zeros((n, T), dtype=rn.dtype)
    for i in range(n):
        idx = np.flatnonzero(mn[i])
        if len(idx):
            values = vn[i, idx]
            delta = rn[i, idx] + gamma * np.append(values[1:], vn[i, T]) - values
            adv[i, idx] = lfilter([1.0], [1.0, -gamma * lam], delta[::-1])[::-1]
    adv = torch.from_numpy(adv)
    return adv, torch.where(m, adv + v[:, :T], 0.0)


_numba_kernels: dict = {}


def numba_gae_kernels() -> dict:
    """The numba GAE loops, compiled on first use (importing numba costs a second): what a user who
    reaches for numba writes on memr1's semantics. `row`: one reverse loop over time per row, the
    advantage carried in float64 (gamma is a Python float) and each output rounded once to the array's
    dtype, as memr1's kernel does; `row_parallel`: the same with rows under prange, the fair baseline
    when memr1 runs on several threads; `time_major`: the loop over rows innermost, so that a SIMD lane
    can hold a row. All with numba's defaults otherwise (fastmath off)."""
    if _numba_kernels:
        return _numba_kernels
    import numba

    def row(r, v, m, gamma, lam, adv, ret):
        n, T = r.shape
        gl = gamma * lam
        for i in numba.prange(n):
            next_v = np.float64(v[i, T])
            run = 0.0
            for t in range(T - 1, -1, -1):
                if m[i, t]:
                    run = r[i, t] + gamma * next_v - v[i, t] + gl * run
                    next_v = v[i, t]
                    adv[i, t] = run
                    ret[i, t] = run + v[i, t]
                else:
                    adv[i, t] = 0.0
                    ret[i, t] = 0.0

    def time_major(r, v, m, gamma, lam, adv, ret):
        n, T = r.shape
        gl = gamma * lam
        run = np.zeros(n)
        next_v = v[:, T].astype(np.float64)
        for t in range(T - 1, -1, -1):
            for i in range(n):
                real = m[i, t]
                vt = np.float64(v[i, t])
                step = r[i, t] + gamma * next_v[i] - vt + gl * run[i]
                run[i] = step if real else run[i]
                next_v[i] = vt if real else next_v[i]
                adv[i, t] = run[i] if real else 0.0
                ret[i, t] = run[i] + vt if real else 0.0

    _numba_kernels.update(row=numba.njit(row), row_parallel=numba.njit(row, parallel=True),
                          time_major=numba.njit(time_major))
    return _numba_kernels


def gae_numba(r, v, m, gamma: float, lam: float, kernel: str = "row"):
    """A numba GAE loop (numba_gae_kernels) on CPU tensors: values [N, T+1], outputs of the rewards'
    dtype, allocated per call as memr1's are, handed back as tensors (no copies either way)."""
    rn, vn, mn = r.numpy(), v.numpy(), m.numpy()
    adv, ret = np.empty(rn.shape, rn.dtype), np.empty(rn.shape, rn.dtype)
    numba_gae_kernels()[kernel](rn, vn, mn, gamma, lam, adv, ret)
    return torch.from_numpy(adv), torch.from_numpy(ret)


def gae_bytes(n: int, T: int, itemsize: int = 4, mask_itemsize: int = 1) -> int:
    """What GAE over [N, T] reads and writes at the least: rewards, values with their bootstrap column
    and the mask once, the advantages and returns once."""
    return n * T * (itemsize + mask_itemsize + 2 * itemsize) + n * (T + 1) * itemsize


def gae_truth(r: list, v: list, m: list, gamma: float, lam: float) -> list:
    """Scalar reference over Python floats (float64), one sequence at a time."""
    out = []
    for ri, vi, mi in zip(r, v, m):
        a, next_v, run = [0.0] * len(ri), vi[-1], 0.0
        for t in range(len(ri) - 1, -1, -1):
            if mi[t]:
                run = ri[t] + gamma * next_v - vi[t] + gamma * lam * run
                next_v, a[t] = vi[t], run
        out.append(a)
    return out


# ----------------------------------------------------------------------------- log-probs
def logprob_inputs(m: int, h: int, v: int, device: str = "cpu"):
    """The benchmark's hidden states [M, H], head weight [V, H] and targets [M], from seed 0."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(m, h, generator=g)
    weight = torch.randn(v, h, generator=g) * 0.05
    targets = torch.randint(0, v, (m,), generator=g)
    return hidden.to(device), weight.to(device), targets.to(device)


def logprobs_naive(hidden, weight, targets):
    """Full logits, log_softmax, gather, by plain autograd: two [M, V] tensors and no third (memr1's
    logprobs_ref also divides the logits by the temperature into a new tensor first)."""
    return torch.log_softmax(hidden @ weight.T, dim=-1).gather(1, targets[:, None])[:, 0]


def trl_selective_log_softmax():
    """TRL's selective_log_softmax (trl.trainer.utils), or None when TRL is not installed."""
    from memr1.bench.trl_stubs import stub_missing_trl_imports
    stub_missing_trl_imports()
    try:
        from trl.trainer.utils import selective_log_softmax
    except ImportError:
        return None
    return selective_log_softmax


def trl_chunked_logprob():
    """The chunked log-prob function TRL's GRPO trainer calls through its fused LM head
    (trl.kernels.ChunkedLogProbFunction; torch ops per tile on CPU), or None without TRL."""
    from memr1.bench.trl_stubs import stub_missing_trl_imports
    stub_missing_trl_imports()
    try:
        from trl.kernels import ChunkedLogProbFunction
        from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE
    except ImportError:
        return None
    # Log-probs only (outputs=()), the same work as memr1's path; GRPO also asks for the entropy.
    return lambda hidden, weight, targets: ChunkedLogProbFunction.apply(
        hidden, weight, None, targets, 1.0, _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0, ())[0]


def logprobs_trl(hidden, weight, targets, rows: int, fn):
    """TRL's path as its trainers call it: logits [B, T, V] from the head, then selective_log_softmax
    (gather the picked logits, a logsumexp per sequence row to bound memory)."""
    logits = (hidden @ weight.T).view(rows, -1, weight.shape[0])
    return fn(logits, targets.view(rows, -1)).reshape(-1)


def logprobs_truth64(hidden, weight, targets, chunk: int = 512):
    """Float64 log-probs and the gradients of their sum: d/dz = onehot(target) - softmax(z), then back
    through z = hidden @ weight.T; chunked over rows to bound memory."""
    h, w = hidden.double(), weight.double()
    m = h.shape[0]
    lp, gh, gw = torch.empty(m, dtype=torch.float64), torch.empty_like(h), torch.zeros_like(w)
    for s in range(0, m, chunk):
        e = min(m, s + chunk)
        z = h[s:e] @ w.T
        lse = torch.logsumexp(z, dim=-1)
        rows = torch.arange(e - s)
        lp[s:e] = z[rows, targets[s:e]] - lse
        g = z.sub_(lse[:, None]).exp_().neg_()
        g[rows, targets[s:e]] += 1.0
        gh[s:e] = g @ w
        gw.addmm_(g.T, h[s:e])
    return lp, gh, gw
