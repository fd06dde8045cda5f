"""Selected-token log-probs (and entropy) of a linear head, without full-vocabulary logits.

logprobs(hidden [M, H], weight [V, H], targets [M]) = log_softmax(hidden @ weight.T / temperature)
gathered at targets, computed chunk_tokens rows at a time. Only one chunk of fp32 logits exists at a
time; backward recomputes each chunk's logits from hidden and weight (saved anyway) instead of
keeping them, and turns them into d loss / d logits in place:
    d logprob / d z = onehot(target) - p
    d entropy / d z = -p * (log p + entropy)
then multiplies by 1/temperature and back through the matmul. `weight` may be a tied embedding.

Both paths compute the logits with torch matmuls (the matmul is the cost, and cuBLAS / oneDNN already
do it well). The Triton path replaces the row-wise softmax work with two kernels: one pass over the
vocabulary with an online log-sum-exp for the forward, and an in-place gradient for the backward,
so a chunk needs one [C, V] fp32 buffer. The torch path needs two to three.

Targets must lie in [0, V); a row whose target is outside gets a NaN log-prob (checking would cost a
host sync). Results are fp32 (fp64 for fp64 inputs, so gradcheck applies); logits are formed in the
input dtype and upcast, as a model's own lm_head would.
"""
import torch

from memr1.kernels._dispatch import jit, next_pow2, resolve_impl, tl


def logprobs_ref(hidden, weight, targets, *, temperature=1.0, entropy=False):
    """The naive path: full logits, log_softmax, gather. Differentiable by plain autograd."""
    z = hidden @ weight.T
    logp = torch.log_softmax((z if z.dtype == torch.float64 else z.float()) / temperature, dim=-1)
    ok = (targets >= 0) & (targets < weight.shape[0])
    lp = logp.gather(1, torch.where(ok, targets, 0)[:, None])[:, 0]
    lp = torch.where(ok, lp, torch.nan)
    if not entropy:
        return lp
    return lp, -(logp.exp() * logp).sum(-1)


def _check(hidden, weight, targets, temperature, chunk_tokens):
    if not isinstance(hidden, torch.Tensor) or hidden.ndim != 2 or not hidden.is_floating_point():
        raise ValueError("hidden must be a 2-D floating tensor [M, H]")
    m, h = hidden.shape
    if not isinstance(weight, torch.Tensor) or weight.ndim != 2 or weight.shape[1] != h:
        raise ValueError(f"weight must have shape [V, {h}], got {tuple(getattr(weight, 'shape', ()))}")
    if weight.dtype != hidden.dtype:
        raise ValueError(f"hidden ({hidden.dtype}) and weight ({weight.dtype}) must share a dtype")
    if not isinstance(targets, torch.Tensor) or targets.shape != (m,) or targets.is_floating_point():
        raise ValueError(f"targets must be an integer tensor of shape [{m}]")
    if hidden.device != weight.device or hidden.device != targets.device:
        raise ValueError("hidden, weight and targets must be on one device")
    if not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be a positive int, got {chunk_tokens!r}")


def logprobs(hidden, weight, targets, *, temperature=1.0, entropy=False, chunk_tokens=1024,
             impl="auto"):
    """Log-probs [M] (fp32), or (log-probs, entropies) with entropy=True.

    Differentiable with respect to hidden and weight. Peak extra memory is about chunk_tokens x V x 4
    bytes per live buffer instead of M x V x 4 several times over.
    """
    _check(hidden, weight, targets, temperature, chunk_tokens)
    use_triton = resolve_impl(impl, hidden.device) == "triton"
    lp, ent = _Chunked.apply(hidden, weight, targets.contiguous(), float(temperature),
                             bool(entropy), chunk_tokens, use_triton)
    return (lp, ent) if entropy else lp


def _logits(h, weight, inv_t, use_triton):
    z = h @ weight.T
    z = z if z.dtype == torch.float64 else z.float()
    if not use_triton:  # the kernels fold the temperature into their loads
        z.mul_(inv_t)
    return z


class _Chunked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, want_entropy, chunk, use_triton):
        m, dev = hidden.shape[0], hidden.device
        inv_t = 1.0 / temperature
        acc = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        lp = torch.empty(m, dtype=acc, device=dev)
        lse = torch.empty(m, dtype=acc, device=dev)
        ent = torch.empty(m, dtype=acc, device=dev)
        for s in range(0, m, chunk):
            e = min(m, s + chunk)
            z = _logits(hidden[s:e], weight, inv_t, use_triton)
            if use_triton:
                _launch_forward(z, targets[s:e], inv_t, lp[s:e], lse[s:e], ent[s:e])
            else:
                _forward_rows(z, targets[s:e], lp[s:e], lse[s:e], ent[s:e], want_entropy)
            del z
        ctx.save_for_backward(hidden, weight, targets, lse, ent)
        ctx.conf = (inv_t, want_entropy, chunk, use_triton)
        if not want_entropy:
            ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        hidden, weight, targets, lse, ent = ctx.saved_tensors
        inv_t, want_entropy, chunk, use_triton = ctx.conf
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        m = hidden.shape[0]
        g_lp = torch.zeros_like(lse) if g_lp is None else g_lp.to(lse.dtype).contiguous()
        g_ent = None if (g_ent is None or not want_entropy) else g_ent.to(lse.dtype).contiguous()
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=lse.dtype, device=weight.device) if need_w else None
        for s in range(0, m, chunk):
            e = min(m, s + chunk)
            z = _logits(hidden[s:e], weight, inv_t, use_triton)
            ge = None if g_ent is None else g_ent[s:e]
            if use_triton:
                _launch_backward(z, targets[s:e], inv_t, lse[s:e], ent[s:e], g_lp[s:e], ge)
            else:
                _backward_rows(z, targets[s:e], inv_t, lse[s:e], ent[s:e], g_lp[s:e], ge)
            gz = z.to(hidden.dtype)  # d loss / d raw logits, temperature included
            if need_h:
                torch.mm(gz, weight, out=grad_h[s:e])
            if need_w:
                grad_w.addmm_(z.T, hidden[s:e].to(z.dtype))
            del z, gz
        return grad_h, (grad_w.to(weight.dtype) if need_w else None), None, None, None, None, None


def _forward_rows(z, tgt, lp, lse, ent, want_entropy):
    """Torch path of the row statistics of one chunk of scaled logits z [C, V] (clobbers z)."""
    v = z.shape[1]
    ok = (tgt >= 0) & (tgt < v)
    picked = z.gather(1, torch.where(ok, tgt, 0)[:, None])[:, 0]
    lse.copy_(torch.logsumexp(z, dim=-1))
    lp.copy_(torch.where(ok, picked - lse, torch.nan))
    if want_entropy:
        logp = z.sub_(lse[:, None])
        ent.copy_(-logp.exp().mul_(logp).sum(-1))
    else:
        ent.zero_()


def _backward_rows(z, tgt, inv_t, lse, ent, g_lp, g_ent):
    """Overwrite scaled logits z [C, V] with d loss / d raw logits."""
    logp = z.sub_(lse[:, None])
    if g_ent is None:  # -p * g_lp
        grad = logp.exp_().mul_(-g_lp[:, None])
    else:  # -p * (g_lp + g_ent * (log p + H)); p needs its own buffer
        p = logp.exp()
        grad = logp.add_(ent[:, None]).mul_(g_ent[:, None]).add_(g_lp[:, None]).mul_(p).neg_()
        del p
    v = grad.shape[1]
    ok = (tgt >= 0) & (tgt < v)
    grad.scatter_add_(1, torch.where(ok, tgt, 0)[:, None], torch.where(ok, g_lp, 0.0)[:, None])
    grad.mul_(inv_t)


# ----------------------------------------------------------------------------- Triton path
ROWS = 4  # rows of a chunk per program


def _blocks(v):
    return min(1024, next_pow2(v))


def _launch_forward(z, tgt, inv_t, lp, lse, ent):
    c, v = z.shape
    _row_stats[(-(-c // ROWS),)](z, tgt, lp, lse, ent, c, v, z.stride(0), inv_t,
                                 ROWS=ROWS, BLOCK_V=_blocks(v))


def _launch_backward(z, tgt, inv_t, lse, ent, g_lp, g_ent):
    c, v = z.shape
    _row_grad[(-(-c // ROWS),)](z, tgt, lse, ent, g_lp, g_ent if g_ent is not None else g_lp,
                                c, v, z.stride(0), inv_t, HAS_ENT=g_ent is not None,
                                ROWS=ROWS, BLOCK_V=_blocks(v))


@jit
def _row_stats(z_ptr, t_ptr, lp_ptr, lse_ptr, ent_ptr, C, V, sz, inv_t,
               ROWS: tl.constexpr, BLOCK_V: tl.constexpr):
    # Online log-sum-exp over vocabulary blocks: running max mx, running sum s of exp(z - mx) and
    # running sum w of exp(z - mx) * z, rescaled whenever the max grows. Entropy = lse - w / s.
    # Rows past the chunk re-read its last row (clamped), so no lane works on an all-masked row.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ok = rows < C
    rd = tl.minimum(rows, C - 1).to(tl.int64)  # C * V may pass 2**31
    tgt = tl.load(t_ptr + rd)
    acc = z_ptr.dtype.element_ty
    mx = tl.full((ROWS,), float("-inf"), acc)
    s = tl.zeros((ROWS,), acc)
    w = tl.zeros((ROWS,), acc)
    picked = tl.zeros((ROWS,), acc)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        inb = cols[None, :] < V
        z = tl.load(z_ptr + rd[:, None] * sz + cols[None, :], mask=inb, other=float("-inf"))
        z = z * inv_t
        new_mx = tl.maximum(mx, tl.max(z, axis=1))
        safe = tl.where(new_mx == float("-inf"), 0.0, new_mx)
        scale = tl.exp(mx - safe)
        e = tl.exp(z - safe[:, None])
        s = s * scale + tl.sum(e, axis=1)
        w = w * scale + tl.sum(e * tl.where(e > 0.0, z, 0.0), axis=1)
        picked += tl.sum(tl.where(cols[None, :] == tgt[:, None], z, 0.0), axis=1)
        mx = new_mx
    lse = mx + tl.log(s)
    valid = (tgt >= 0) & (tgt < V)
    tl.store(lp_ptr + rows, tl.where(valid, picked - lse, float("nan")), mask=ok)
    tl.store(lse_ptr + rows, lse, mask=ok)
    tl.store(ent_ptr + rows, lse - w / s, mask=ok)


@jit
def _row_grad(z_ptr, t_ptr, lse_ptr, ent_ptr, glp_ptr, gent_ptr, C, V, sz, inv_t,
              HAS_ENT: tl.constexpr, ROWS: tl.constexpr, BLOCK_V: tl.constexpr):
    # In place: z (raw logits) becomes inv_t * (onehot * g_lp - p * (g_lp + g_ent * (log p + H))).
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ok = rows < C
    rd = tl.minimum(rows, C - 1).to(tl.int64)
    tgt = tl.load(t_ptr + rd)
    lse = tl.load(lse_ptr + rd)
    glp = tl.load(glp_ptr + rd)
    ent = tl.load(ent_ptr + rd)
    gent = tl.load(gent_ptr + rd)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        inb = ok[:, None] & (cols[None, :] < V)
        ptrs = z_ptr + rd[:, None] * sz + cols[None, :]
        logp = tl.load(ptrs, mask=inb, other=0.0) * inv_t - lse[:, None]
        p = tl.exp(logp)
        if HAS_ENT:
            g = -p * (glp[:, None] + gent[:, None] * (logp + ent[:, None]))
        else:
            g = -p * glp[:, None]
        g += tl.where(cols[None, :] == tgt[:, None], glp[:, None], 0.0)
        tl.store(ptrs, g * inv_t, mask=inb)
