"""logprobs: chunked values and gradients against the naive log_softmax(hidden @ W.T / T) path."""
import math
import secrets

import pytest
import torch

from memr1.kernels import logprobs, logprobs_ref
from kernel_helpers import DEVICES, IMPLS, need


def inputs(m, h, v, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(m, h, generator=g, dtype=torch.float64).to(device, dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=g, dtype=torch.float64) / math.sqrt(h) * 3)
    weight = weight.to(device, dtype).requires_grad_()
    targets = torch.randint(0, v, (m,), generator=g).to(device)
    return hidden, weight, targets


def value_and_grads(fn, hidden, weight, want_entropy, seed):
    out = fn()
    outs = out if want_entropy else (out,)
    g = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype).to(o.device)).sum() for o in outs)
    gh, gw = torch.autograd.grad(loss, (hidden, weight))
    return [o.detach() for o in outs] + [gh, gw]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("want_entropy", [False, True])
def test_matches_naive(poisoned, device, impl, dtype, want_entropy):
    need(device, impl)
    # 45 rows in chunks of 16 (the last one short); V = 301 is no power of two nor block multiple.
    seed = secrets.randbelow(2**31)
    hidden, weight, targets = inputs(45, 24, 301, dtype, device, seed)
    kw = dict(temperature=0.7, entropy=want_entropy)
    ours = value_and_grads(lambda: logprobs(hidden, weight, targets, chunk_tokens=16, impl=impl, **kw),
                           hidden, weight, want_entropy, seed=5)
    naive = value_and_grads(lambda: logprobs_ref(hidden, weight, targets, **kw),
                            hidden, weight, want_entropy, seed=5)
    tol = 1e-5 if dtype == torch.float32 else 1e-11
    for a, b in zip(ours, naive):
        assert a.dtype == b.dtype and not torch.isnan(a).any()
        assert (a - b).abs().max().item() <= tol * max(1.0, b.abs().max().item()), f"seed {seed}"


@pytest.mark.parametrize("impl", IMPLS)
def test_gradcheck(impl):
    need("cpu", impl)
    hidden, weight, targets = inputs(5, 3, 7, torch.float64, "cpu", seed=0)

    def f(h, w):
        lp, ent = logprobs(h, w, targets, temperature=1.3, entropy=True, chunk_tokens=2, impl=impl)
        return lp, ent

    # fast mode (random projections) keeps the interpreted kernels to a few dozen launches
    assert torch.autograd.gradcheck(f, (hidden, weight), eps=1e-6, atol=1e-7,
                                    fast_mode=impl == "triton")


@pytest.mark.parametrize("impl", IMPLS)
def test_tied_embedding(impl):
    """weight = embed.weight: gradients from the head and from the lookup add up in one tensor."""
    need("cpu", impl)
    torch.manual_seed(0)
    embed = torch.nn.Embedding(50, 8, dtype=torch.float64)
    ids = torch.randint(0, 50, (2, 9))
    hidden = torch.tanh(embed(ids[:, :-1])).reshape(-1, 8)
    lp = logprobs(hidden, embed.weight, ids[:, 1:].reshape(-1), chunk_tokens=5, impl=impl)
    lp.sum().backward()
    ours = embed.weight.grad.clone()
    embed.weight.grad = None
    hidden = torch.tanh(embed(ids[:, :-1])).reshape(-1, 8)
    logprobs_ref(hidden, embed.weight, ids[:, 1:].reshape(-1)).sum().backward()
    torch.testing.assert_close(ours, embed.weight.grad, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("impl", IMPLS)
def test_bf16_inputs_give_fp32_results(impl):
    need("cpu", impl)
    hidden, weight, targets = inputs(20, 16, 64, torch.bfloat16, "cpu", seed=1)
    lp, ent = logprobs(hidden, weight, targets, entropy=True, chunk_tokens=8, impl=impl)
    ref_lp, ref_ent = logprobs_ref(hidden, weight, targets, entropy=True)
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)
    (lp.sum() + ent.sum()).backward()
    assert hidden.grad.dtype == torch.bfloat16 and weight.grad.dtype == torch.bfloat16
    assert torch.isfinite(hidden.grad.float()).all() and torch.isfinite(weight.grad.float()).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_entropy_of_uniform_and_peaked(impl):
    need("cpu", impl)
    hidden = torch.zeros(3, 4, dtype=torch.float64)
    weight = torch.randn(10, 4, dtype=torch.float64)
    lp, ent = logprobs(hidden, weight, torch.tensor([0, 4, 9]), entropy=True, impl=impl)
    torch.testing.assert_close(ent, torch.full((3,), math.log(10), dtype=torch.float64))
    torch.testing.assert_close(lp, torch.full((3,), -math.log(10), dtype=torch.float64))
    hidden = torch.tensor([[100.0, 0, 0, 0]], dtype=torch.float64)
    weight = torch.eye(4, dtype=torch.float64)
    lp, ent = logprobs(hidden, weight, torch.tensor([0]), entropy=True, impl=impl)
    assert abs(lp.item()) < 1e-12 and 0 <= ent.item() < 1e-12


@pytest.mark.parametrize("impl", IMPLS)
def test_out_of_range_target_is_nan_not_crash(impl):
    need("cpu", impl)
    hidden, weight, targets = inputs(6, 4, 11, torch.float32, "cpu", seed=2)
    targets = targets.clone()
    targets[2] = 11
    lp = logprobs(hidden, weight, targets, impl=impl)
    assert torch.isnan(lp[2]) and torch.isfinite(lp[torch.arange(6) != 2]).all()


def test_bad_arguments_are_named():
    h, w, t = torch.zeros(4, 3), torch.zeros(5, 3), torch.zeros(4, dtype=torch.long)
    cases = [
        ((h[0], w, t), {}, "hidden"),
        ((h, torch.zeros(5, 2), t), {}, "weight"),
        ((h, w.double(), t), {}, "dtype"),
        ((h, w, t[:3]), {}, "targets"),
        ((h, w, t.float()), {}, "targets"),
        ((h, w, t), {"temperature": 0.0}, "temperature"),
        ((h, w, t), {"chunk_tokens": 0}, "chunk_tokens"),
        ((h, w, t), {"impl": "fast"}, "impl"),
    ]
    for args, kw, word in cases:
        with pytest.raises(ValueError, match=word):
            logprobs(*args, **kw)
