"""Generalised advantage estimation (PPO) as a reverse scan over time: a Triton kernel for CUDA
tensors, a C++ kernel for CPU tensors (the operator memr1::gae_cpu of csrc/gae.cpp: a vectorised scan
on CPUs with AVX-512, a loop elsewhere), and the torch reference that all are tested against.

Semantics (shared by all three):
- values is [N, T+1], where values[:, T] is the value after the last step, or [N, T] with
  `bootstrap` [N] giving that value (zeros when bootstrap is None: a terminal end).
- A step with mask == 0 is skipped: it leaves the running advantage and the next value untouched, so
  padding at the end passes the bootstrap value to the last real token, and a masked gap in the
  middle (e.g. tool output in a multi-turn response) joins the real tokens on either side with one
  discount per real step:
      delta_t = r_t + gamma * V_next - V_t
      A_t     = delta_t + gamma * lam * A_next
  where V_next and A_next come from the next real step (the bootstrap value and 0 at the end).
- Returns are A_t + V_t. Both outputs are 0 where mask == 0.
- whiten=True shifts and scales the advantages over all real tokens, (A - mean) / sqrt(var + 1e-8)
  with the unbiased variance; returns are computed before whitening. No host sync in any path.
"""
import torch

from memr1.kernels._dispatch import jit, resolve_impl, tl

ROWS = 64  # sequences per program


def _inputs(rewards, values, mask, gamma, lam, bootstrap):
    for name, t in (("rewards", rewards), ("values", values), ("mask", mask)):
        if not isinstance(t, torch.Tensor) or t.ndim != 2:
            raise ValueError(f"{name} must be a 2-D tensor")
    if not rewards.is_floating_point() or not values.is_floating_point():
        raise ValueError("rewards and values must be floating tensors")
    n, T = rewards.shape
    if mask.shape != (n, T):
        raise ValueError(f"mask must have shape {(n, T)} like rewards, got {tuple(mask.shape)}")
    if values.shape == (n, T + 1):
        if bootstrap is not None:
            raise ValueError("values already holds the bootstrap column [N, T+1]; drop bootstrap")
        boot = values[:, -1]  # not [:, T]: indexing by a size would pin it under torch.compile
    elif values.shape == (n, T):
        if bootstrap is None:
            boot = torch.zeros(n, dtype=values.dtype, device=values.device)
        elif bootstrap.shape != (n,):
            raise ValueError(f"bootstrap must have shape [{n}], got {tuple(bootstrap.shape)}")
        else:
            boot = bootstrap
    else:
        raise ValueError(f"values must have shape [{n}, {T + 1}] or [{n}, {T}], got {tuple(values.shape)}")
    for name, x in (("gamma", gamma), ("lam", lam)):
        if not isinstance(x, (int, float)) or not 0.0 <= x <= 1.0:
            raise ValueError(f"{name} must be a float in [0, 1], got {x!r}")
    devs = {t.device for t in (rewards, values, mask, boot)}
    if len(devs) != 1:
        raise ValueError(f"rewards, values, mask and bootstrap must share a device, got {devs}")
    dtype = torch.float64 if rewards.dtype == torch.float64 else torch.float32
    return dtype, boot


def gae_ref(rewards, values, mask, gamma, lam, *, bootstrap=None, whiten=False):
    """Torch reference: the TD errors for all steps at once, then one fused op per time step.

    V_next of every step is the value at the next real step, found with a reverse cummin over the
    positions of real steps. A skipped step has coefficient 1 and TD error 0, so the scan is
    A_t = A_{t+1} * coef_t + delta_t with coef_t = gamma * lam on real steps.
    """
    dtype, boot = _inputs(rewards, values, mask, gamma, lam, bootstrap)
    n, T = rewards.shape
    r, m = rewards.to(dtype), mask != 0
    v_ext = torch.cat([values[:, :T].to(dtype), boot.to(dtype)[:, None]], dim=1)  # column T: bootstrap
    pos = torch.where(m, torch.arange(T, device=r.device), T)
    nearest = pos.flip(1).cummin(1).values.flip(1)  # first real step at or after t (T if none)
    nxt = torch.cat([nearest[:, 1:], torch.full_like(nearest[:, :1], T)], dim=1)
    delta = torch.where(m, r + gamma * v_ext.gather(1, nxt) - v_ext[:, :T], 0.0).T.contiguous()
    coef = torch.full((n, T), gamma * lam, dtype=dtype, device=r.device).masked_fill_(~m, 1.0)
    coef = coef.T.contiguous()
    adv_t = torch.empty((T, n), dtype=dtype, device=r.device)  # time-major: each step is contiguous
    last = torch.zeros(n, dtype=dtype, device=r.device)
    for t in range(T - 1, -1, -1):
        last = torch.addcmul(delta[t], last, coef[t], out=adv_t[t])
    adv = torch.where(m, adv_t.T, 0.0)
    ret = torch.where(m, adv + v_ext[:, :T], 0.0)
    return (_whiten(adv, m) if whiten else adv), ret


def _whiten(adv, m):
    w = m.to(adv.dtype)
    count = w.sum()
    mean = (adv * w).sum() / count.clamp(min=1)
    var = (((adv - mean) * w) ** 2).sum() / (count - 1).clamp(min=1)
    return torch.where(m, (adv - mean) * torch.rsqrt(var + 1e-8), 0.0)


def gae(rewards, values, mask, gamma, lam, *, whiten=False, bootstrap=None, impl="auto"):
    """Advantages [N, T] and returns [N, T]; see the module docstring for the semantics.

    Output dtype is float64 for float64 rewards, float32 otherwise.
    """
    dtype, boot = _inputs(rewards, values, mask, gamma, lam, bootstrap)
    which = resolve_impl(impl, rewards.device, native=True)
    if which == "torch":
        return gae_ref(rewards, values, mask, gamma, lam, bootstrap=bootstrap, whiten=whiten)
    n, T = rewards.shape
    r, v = rewards.to(dtype), values.to(dtype)
    boot = boot.to(dtype)
    if which == "native":  # csrc/gae.cpp, a torch operator; strided views are read in place
        m = mask if mask.dtype in (torch.bool, torch.uint8) else mask != 0
        adv, ret = torch.ops.memr1.gae_cpu(r.detach(), v.detach()[:, :T], m, boot.detach(), float(gamma),
                                           float(gamma * lam))
    else:
        m = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
        adv = torch.empty((n, T), dtype=dtype, device=r.device)
        ret = torch.empty_like(adv)
        if n > 0 and T > 0:
            _gae_kernel[(-(-n // ROWS),)](
                r, v, m, boot, adv, ret, n, T,
                r.stride(0), r.stride(1), v.stride(0), v.stride(1), m.stride(0), m.stride(1),
                boot.stride(0), float(gamma), float(gamma * lam), ROWS=ROWS)
    if whiten:
        adv = _whiten(adv, mask != 0)
    return adv, ret


@jit
def _gae_kernel(r_ptr, v_ptr, m_ptr, boot_ptr, adv_ptr, ret_ptr, N, T,
                sr0, sr1, sv0, sv1, sm0, sm1, sb, gamma, gamma_lam, ROWS: tl.constexpr):
    # One program walks ROWS sequences backwards in time together; the loads of one step are a
    # strided column, which is cheap next to the serial dependence along T.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ok = rows < N
    rows = rows.to(tl.int64)  # N * T may pass 2**31
    next_v = tl.load(boot_ptr + rows * sb, mask=ok, other=0.0)
    last = next_v * 0.0
    for i in range(0, T):
        t = T - 1 - i
        mt = tl.load(m_ptr + rows * sm0 + t * sm1, mask=ok, other=0) != 0
        rt = tl.load(r_ptr + rows * sr0 + t * sr1, mask=ok, other=0.0)
        vt = tl.load(v_ptr + rows * sv0 + t * sv1, mask=ok, other=0.0)
        delta = rt + gamma * next_v - vt
        last = tl.where(mt, delta + gamma_lam * last, last)
        next_v = tl.where(mt, vt, next_v)
        tl.store(adv_ptr + rows * T + t, tl.where(mt, last, 0.0), mask=ok)
        tl.store(ret_ptr + rows * T + t, tl.where(mt, last + vt, 0.0), mask=ok)
