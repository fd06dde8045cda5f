"""Group-normalised advantages for GRPO / Dr.GRPO / RLOO, with a fused broadcast to tokens.

Three paths: Triton kernels for CUDA tensors, a C++ loop for CPU tensors (the operator
memr1::grpo_advantage_cpu of csrc/grpo_advantage.cpp: two passes with float64 sums), and the torch
reference that both are tested against. Semantics (shared by all three):
- Group g holds the sequences i with group_ids[i] == g; ids must lie in [0, num_groups). Groups may be
  ragged, empty and non-contiguous. A row with an id outside that range takes no part in any group
  and gets a NaN advantage (validate=True turns that into a ValueError instead).
- Statistics are taken on rewards shifted by a pivot, one member's reward (the max in the Triton
  kernels, the first in row order in the C++ loop, the last one scattered in the reference), then in
  two passes (mean, then centred squares; the C++ loop takes both sums in one float64 pass, exact
  enough because a member pivot bounds the cancellation). The shift makes r - pivot exact for rewards
  with a large common offset, and it makes an all-equal group centre to exactly 0.
- std: "unbiased" (n-1), "population" (n) or "none" (Dr.GRPO, no scaling).
  baseline "mean":  a_i = (r_i - mean_g) / (std_g + eps)
  baseline "loo":   a_i = (r_i - mean of the other members) / (std_g + eps)
                        = n/(n-1) * (r_i - mean_g) / (std_g + eps)     (RLOO)
  With std="none" the division is dropped. A singleton group and an all-equal group give exactly 0,
  never NaN, even with eps=0.
- Tokens: with response_mask [N, T] the result is a_i where mask != 0 and 0 elsewhere. With
  token_offsets [N+1] (packed sequences, nondecreasing) token p of [offsets[i], offsets[i+1]) gets a_i
  and every other position of [0, total) gets 0; total is `total_tokens` if given, else
  token_offsets[-1], which is read on the host: free when token_offsets is a CPU tensor, one sync when
  it lives on the GPU.
- No host sync otherwise. validate=True does sync: it checks rewards for NaN/inf, ids for range and
  offsets for order, and raises ValueError naming the first bad index.
"""
import math

import torch

from memr1.kernels._dispatch import jit, resolve_impl, tl

STDS = {"unbiased": 0, "population": 1, "none": 2}
BASELINES = ("mean", "loo")


def _compute_dtype(rewards):
    return torch.float64 if rewards.dtype == torch.float64 else torch.float32


def grpo_advantage_ref(rewards, group_ids, num_groups, *, response_mask=None, token_offsets=None,
                       std="unbiased", eps=1e-6, baseline="mean", total_tokens=None):
    """Torch reference: the kernels' arithmetic with scatter ops in place of atomics.

    Group g lives in slot g + 1 of [G + 2] buffers; ids below range land in slot 0 and ids above in
    slot G + 1, so no pass needs a mask and those rows come out NaN through their factor. Per-group
    work runs on [G + 2] tensors; only three [N] gathers remain.
    """
    r = rewards.to(_compute_dtype(rewards))
    slot = (group_ids.long() + 1).clamp_(0, num_groups + 1)
    size = num_groups + 2
    zeros = torch.zeros(size, dtype=r.dtype, device=r.device)
    pivot = zeros.clone().scatter_(0, slot, r)  # some member of each group (see module docstring)
    d = r - pivot.index_select(0, slot)
    n = zeros.clone().scatter_add_(0, slot, torch.ones_like(r))
    mean_d = zeros.clone().scatter_add_(0, slot, d) / n.clamp(min=1)
    c = d - mean_d.index_select(0, slot)
    ss = zeros.scatter_add_(0, slot, c * c)
    factor = _group_factor(n, ss, STDS[std], baseline == "loo", eps)
    factor[0].fill_(math.nan)  # the out-of-range slots (fill_: no host round trip on CUDA)
    factor[-1].fill_(math.nan)
    adv = c * factor.index_select(0, slot)
    return adv, _broadcast_ref(adv, response_mask, token_offsets, total_tokens)


def _group_factor(n, ss, std_kind, loo, eps):
    """Per group: what a centred reward is multiplied by (the LOO factor over std + eps)."""
    factor = torch.where(n > 1, n / (n - 1).clamp(min=1), 0.0) if loo else torch.ones_like(n)
    if std_kind == 2:
        return factor
    var = ss / ((n - 1).clamp(min=1) if std_kind == 0 else n.clamp(min=1))
    den = var.sqrt() + eps
    return torch.where(den > 0, factor / torch.where(den > 0, den, 1.0), 0.0)


def _broadcast_ref(adv, response_mask, token_offsets, total_tokens):
    if response_mask is not None:
        return torch.where(response_mask != 0, adv[:, None], 0.0)
    if token_offsets is None:
        return None
    total = _packed_total(token_offsets, total_tokens)
    pos = torch.arange(total, device=adv.device)
    seq = torch.searchsorted(token_offsets.to(adv.device), pos, right=True) - 1
    inside = (seq >= 0) & (seq < adv.shape[0])
    return torch.where(inside, adv[seq.clamp(0, adv.shape[0] - 1)], 0.0)


def _packed_total(token_offsets, total_tokens):
    if total_tokens is not None:
        return int(total_tokens)
    return int(token_offsets[-1])  # host read; free for CPU offsets, one sync for CUDA offsets


def _check(rewards, group_ids, num_groups, response_mask, token_offsets, std, eps, baseline,
           total_tokens):
    if not isinstance(rewards, torch.Tensor) or rewards.ndim != 1 or not rewards.is_floating_point():
        raise ValueError("rewards must be a 1-D floating tensor [N]")
    n = rewards.shape[0]
    if not isinstance(group_ids, torch.Tensor) or group_ids.shape != (n,) or \
            group_ids.is_floating_point() or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor of shape [{n}] matching rewards")
    if group_ids.device != rewards.device:
        raise ValueError("group_ids must be on the same device as rewards")
    if not isinstance(num_groups, int) or isinstance(num_groups, bool) or num_groups < 0:
        raise ValueError(f"num_groups must be an int >= 0, got {num_groups!r}")
    if std not in STDS:
        raise ValueError(f"std must be one of {tuple(STDS)}, got {std!r}")
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    if not (isinstance(eps, (int, float)) and eps >= 0):
        raise ValueError(f"eps must be a float >= 0, got {eps!r}")
    if response_mask is not None and token_offsets is not None:
        raise ValueError("give response_mask or token_offsets, not both")
    if response_mask is not None:
        if response_mask.ndim != 2 or response_mask.shape[0] != n:
            raise ValueError(f"response_mask must have shape [{n}, T], got {tuple(response_mask.shape)}")
        if response_mask.device != rewards.device:
            raise ValueError("response_mask must be on the same device as rewards")
    if token_offsets is not None:
        if token_offsets.shape != (n + 1,) or token_offsets.is_floating_point():
            raise ValueError(f"token_offsets must be an integer tensor of shape [{n + 1}]")
    if total_tokens is not None and (not isinstance(total_tokens, int) or total_tokens < 0):
        raise ValueError(f"total_tokens must be an int >= 0, got {total_tokens!r}")


def _validate(rewards, group_ids, num_groups, token_offsets):
    """The syncing checks of validate=True."""
    bad = ~torch.isfinite(rewards)
    if bool(bad.any()):
        i = int(bad.to(torch.uint8).argmax())
        raise ValueError(f"rewards[{i}] is {rewards[i].item()} (not finite)")
    out = (group_ids < 0) | (group_ids >= num_groups)
    if bool(out.any()):
        i = int(out.to(torch.uint8).argmax())
        raise ValueError(f"group_ids[{i}] = {int(group_ids[i])} is outside [0, {num_groups})")
    if token_offsets is not None:
        down = token_offsets[1:] < token_offsets[:-1]
        if bool(down.any()) or int(token_offsets[0]) < 0:
            i = int(down.to(torch.uint8).argmax()) + 1 if bool(down.any()) else 0
            raise ValueError(f"token_offsets must be nondecreasing and >= 0; bad at index {i}")


def grpo_advantage(rewards, group_ids, num_groups, *, response_mask=None, token_offsets=None,
                   std="unbiased", eps=1e-6, baseline="mean", validate=False, impl="auto",
                   total_tokens=None):
    """Per-sequence advantages [N] and per-token advantages ([N, T], packed [total] or None).

    See the module docstring for the exact semantics. Output dtype is float64 for float64 rewards,
    float32 otherwise. `impl`: "auto", "triton", "native" (CPU) or "torch" (kernels/_dispatch.py).
    """
    _check(rewards, group_ids, num_groups, response_mask, token_offsets, std, eps, baseline,
           total_tokens)
    if validate:
        _validate(rewards, group_ids, num_groups, token_offsets)
    kw = dict(response_mask=response_mask, token_offsets=token_offsets, std=std, eps=float(eps),
              baseline=baseline, total_tokens=total_tokens)
    which = resolve_impl(impl, rewards.device, native=True)
    if which == "torch":
        return grpo_advantage_ref(rewards, group_ids, num_groups, **kw)
    if which == "native":  # csrc/grpo_advantage.cpp, a torch operator (torch.compile keeps it in-graph)
        # Advantages are constants of the loss. Each step below makes a new tensor, a few microseconds
        # of a call that takes tens, so only the ones the input needs run.
        r = rewards.detach() if rewards.requires_grad else rewards
        dtype = _compute_dtype(r)
        r = r if r.dtype == dtype else r.to(dtype)
        adv = torch.ops.memr1.grpo_advantage_cpu(r, group_ids, num_groups, STDS[std], baseline == "loo",
                                                 float(eps))
        return adv, _broadcast_ref(adv, response_mask, token_offsets, total_tokens)
    return _grpo_triton(rewards, group_ids, num_groups, **kw)


# ----------------------------------------------------------------------------- Triton path
# Four passes over tiles of BLOCK sequences (not one program per group: the work per group is a few
# scalars, and the interpreter's cost grows with the number of programs). Group statistics live in a
# [4, G] buffer filled with atomics: max, count, sum of shifted rewards, sum of centred squares.

BLOCK = 1024
ROWS, COLS = 32, 128  # token broadcast tile


def _grpo_triton(rewards, group_ids, num_groups, *, response_mask, token_offsets, std, eps,
                 baseline, total_tokens):
    r = rewards.to(_compute_dtype(rewards)).contiguous()
    gid = group_ids.contiguous()
    n = r.shape[0]
    stats = torch.zeros((4, num_groups), dtype=r.dtype, device=r.device)
    stats[0].fill_(-math.inf)
    adv = torch.empty_like(r)
    grid = (max(1, -(-n // BLOCK)),)
    _group_max[grid](r, gid, stats, n, num_groups, BLOCK=BLOCK)
    _group_sum[grid](r, gid, stats, n, num_groups, BLOCK=BLOCK)
    _group_sq[grid](r, gid, stats, n, num_groups, BLOCK=BLOCK)
    mask, tok, T = response_mask, None, 0
    if mask is not None:
        T = mask.shape[1]
        if mask.dtype == torch.bool:
            mask = mask.view(torch.uint8)  # same bytes; loads as integers in every backend
        tok = torch.empty((n, T), dtype=r.dtype, device=r.device)
    rows = ROWS if mask is not None else BLOCK
    _write_adv[(max(1, -(-n // rows)),)](
        r, gid, stats, adv, mask if mask is not None else r, tok if tok is not None else adv,
        n, T, num_groups, mask.stride(0) if mask is not None else 0,
        mask.stride(1) if mask is not None else 0, eps,
        STD=STDS[std], LOO=baseline == "loo", HAS_MASK=mask is not None, ROWS=rows, COLS=COLS)
    if token_offsets is not None:
        total = _packed_total(token_offsets, total_tokens)
        off = token_offsets.to(device=r.device, dtype=torch.int64).contiguous()
        tok = torch.empty(total, dtype=r.dtype, device=r.device)
        if total > 0:
            _write_packed[(-(-total // BLOCK),)](
                adv, off, tok, n, total, BLOCK=BLOCK, STEPS=max(1, (n + 1).bit_length()))
    return adv, tok


@jit
def _group_max(r_ptr, g_ptr, st_ptr, N, G, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    g = tl.load(g_ptr + offs, mask=offs < N, other=-1)
    ok = (offs < N) & (g >= 0) & (g < G)
    r = tl.load(r_ptr + offs, mask=ok, other=0.0)
    tl.atomic_max(st_ptr + g, r, mask=ok)
    tl.atomic_add(st_ptr + G + g, tl.full(r.shape, 1.0, r.dtype), mask=ok)

@jit
def _group_sum(r_ptr, g_ptr, st_ptr, N, G, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    g = tl.load(g_ptr + offs, mask=offs < N, other=-1)
    ok = (offs < N) & (g >= 0) & (g < G)
    r = tl.load(r_ptr + offs, mask=ok, other=0.0)
    d = r - tl.load(st_ptr + g, mask=ok, other=0.0)
    tl.atomic_add(st_ptr + 2 * G + g, d, mask=ok)

@jit
def _centred(r_ptr, g_ptr, st_ptr, offs, N, G):
    g = tl.load(g_ptr + offs, mask=offs < N, other=-1)
    ok = (offs < N) & (g >= 0) & (g < G)
    r = tl.load(r_ptr + offs, mask=ok, other=0.0)
    gmax = tl.load(st_ptr + g, mask=ok, other=0.0)
    n = tl.load(st_ptr + G + g, mask=ok, other=1.0)
    sum_d = tl.load(st_ptr + 2 * G + g, mask=ok, other=0.0)
    c = tl.where(ok, (r - gmax) - sum_d / tl.maximum(n, 1.0), 0.0)
    return g, ok, n, c

@jit
def _group_sq(r_ptr, g_ptr, st_ptr, N, G, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    g, ok, n, c = _centred(r_ptr, g_ptr, st_ptr, offs, N, G)
    tl.atomic_add(st_ptr + 3 * G + g, c * c, mask=ok)

@jit
def _write_adv(r_ptr, g_ptr, st_ptr, adv_ptr, m_ptr, tok_ptr, N, T, G, sm0, sm1, eps,
              STD: tl.constexpr, LOO: tl.constexpr, HAS_MASK: tl.constexpr,
              ROWS: tl.constexpr, COLS: tl.constexpr):
    offs = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    g, ok, n, c = _centred(r_ptr, g_ptr, st_ptr, offs, N, G)
    if LOO:
        c = tl.where(n > 1.0, c * n / tl.maximum(n - 1.0, 1.0), 0.0)
    if STD != 2:
        ss = tl.load(st_ptr + 3 * G + g, mask=ok, other=0.0)
        if STD == 0:
            var = ss / tl.maximum(n - 1.0, 1.0)
        else:
            var = ss / tl.maximum(n, 1.0)
        den = tl.sqrt(var) + eps
        c = tl.where(den > 0.0, c / tl.where(den > 0.0, den, 1.0), 0.0)
    a = tl.where(ok, c, float("nan"))
    tl.store(adv_ptr + offs, a, mask=offs < N)
    if HAS_MASK:
        rows = offs[:, None].to(tl.int64)  # N * T may pass 2**31
        for t0 in range(0, T, COLS):
            cols = t0 + tl.arange(0, COLS)[None, :]
            inb = (rows < N) & (cols < T)
            m = tl.load(m_ptr + rows * sm0 + cols * sm1, mask=inb, other=0)
            tl.store(tok_ptr + rows * T + cols, tl.where(m != 0, a[:, None], 0.0), mask=inb)

@jit
def _write_packed(adv_ptr, off_ptr, tok_ptr, N, TOTAL, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    # Each token finds its sequence by binary search over the offsets: the largest i with
    # offsets[i] <= p, kept as lo in [-1, N]; 0 <= lo < N means the token is inside sequence lo.
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lo = tl.full((BLOCK,), -1, tl.int64)
    hi = tl.full((BLOCK,), 0, tl.int64) + N + 1
    for _ in range(STEPS):
        mid = (lo + hi) // 2
        probe = tl.load(off_ptr + mid, mask=(hi - lo > 1) & (mid >= 0) & (mid <= N), other=0)
        go_right = (hi - lo > 1) & (probe <= p)
        go_left = (hi - lo > 1) & (probe > p)
        lo = tl.where(go_right, mid, lo)
        hi = tl.where(go_left, mid, hi)
    inside = (lo >= 0) & (lo < N)
    a = tl.load(adv_ptr + lo, mask=inside & (p < TOTAL), other=0.0)
    tl.store(tok_ptr + p, tl.where(inside, a, 0.0), mask=p < TOTAL)

