"""gae: the Triton kernel and the C++ CPU path against the torch reference, and the reference against a
scalar Python loop."""
import secrets

import pytest
import torch

from memr1.kernels import gae, gae_ref
from kernel_helpers import DEVICES, GAE_IMPLS, IMPLS, interpreting, need


def batch(n, T, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(n, T, generator=g, dtype=torch.float64)
    values = torch.randn(n, T + 1, generator=g, dtype=torch.float64)
    lengths = torch.randint(0, T + 1, (n,), generator=g)
    lengths[:3] = torch.tensor([0, T, 1])  # empty, full and one-token responses
    mask = torch.arange(T)[None, :] < lengths[:, None]
    mask &= torch.rand(n, T, generator=g) > 0.15  # holes in the middle (multi-turn tool output)
    return rewards.to(device, dtype), values.to(device, dtype), mask.to(device)


def python_gae(rewards, values, mask, gamma, lam, bootstrap):
    """Scalar loops over plain floats: the definition in the module docstring, read literally."""
    n, T = len(rewards), len(rewards[0])
    adv = [[0.0] * T for _ in range(n)]
    ret = [[0.0] * T for _ in range(n)]
    for i in range(n):
        next_v, running = bootstrap[i], 0.0
        for t in reversed(range(T)):
            if not mask[i][t]:
                continue
            delta = rewards[i][t] + gamma * next_v - values[i][t]
            running = delta + gamma * lam * running
            next_v = values[i][t]
            adv[i][t], ret[i][t] = running, running + values[i][t]
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


def test_reference_matches_python_loop():
    r, v, m = batch(9, 13, torch.float64, "cpu", seed=secrets.randbelow(2**31))
    for values, boot in ((v, v[:, -1]), (v[:, :-1], torch.zeros(9))):
        a, ret = gae_ref(r, values, m, 0.97, 0.9)
        a_py, ret_py = python_gae(r.tolist(), values.tolist(), m.tolist(), 0.97, 0.9, boot.tolist())
        torch.testing.assert_close(a, a_py, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ret, ret_py, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("impl", GAE_IMPLS)
def test_hand_computed(impl):
    need("cpu", impl)
    # gamma = lam = 1: the advantage is the sum of the remaining rewards plus the bootstrap minus V_t.
    r = torch.tensor([[1.0, 0.0, 2.0, 9.0]], dtype=torch.float64)
    v = torch.tensor([[0.5, 0.25, 1.0, 7.0, 3.0]], dtype=torch.float64)
    m = torch.tensor([[True, True, True, False]])  # last step is padding: skipped, bootstrap passes
    a, ret = gae(r, v, m, 1.0, 1.0, impl=impl)
    want = torch.tensor([[1 + 0 + 2 + 3 - 0.5, 0 + 2 + 3 - 0.25, 2 + 3 - 1.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(a, want)
    torch.testing.assert_close(ret, torch.tensor([[6.0, 5.0, 5.0, 0.0]], dtype=torch.float64))
    # lam = 0: one-step TD error
    a, _ = gae(r, v, m, 0.5, 0.0, impl=impl)
    torch.testing.assert_close(a, torch.tensor([[1 + 0.125 - 0.5, 0.5 - 0.25, 2 + 1.5 - 1, 0]],
                                               dtype=torch.float64))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_triton_matches_reference(poisoned, device, dtype):
    need(device, "triton")
    n, T = 70, 33  # 70 sequences: two programs of 64, the second partly empty
    seed = secrets.randbelow(2**31)
    r, v, m = batch(n, T, dtype, device, seed)
    boot = torch.randn(n, dtype=dtype, device=device)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    cases = [dict(values=v), dict(values=v[:, :T], bootstrap=boot),
             dict(values=v[:, :T], whiten=True)]
    for kw in cases:
        a_ref, ret_ref = gae(r, mask=m, gamma=0.99, lam=0.95, impl="torch", **kw)
        a, ret = gae(r, mask=m, gamma=0.99, lam=0.95, impl="triton", **kw)
        assert a.dtype == dtype and not torch.isnan(a).any() and not torch.isnan(ret).any()
        scale = max(1.0, a_ref.abs().max().item(), ret_ref.abs().max().item())
        assert (a - a_ref).abs().max().item() <= tol * scale, f"seed {seed}, {kw.keys()}"
        assert (ret - ret_ref).abs().max().item() <= tol * scale, f"seed {seed}, {kw.keys()}"
        assert (a[~m] == 0).all() and (ret[~m] == 0).all()


@pytest.fixture(params=["simd", "loop"])
def native_path(request):
    """Runs a test on each of the C++ operator's two paths: the AVX-512 scan and the scalar loop."""
    need("cpu", "native")
    want = request.param == "simd"
    before = torch.ops.memr1.gae_cpu_simd(-1)
    if torch.ops.memr1.gae_cpu_simd(int(want)) != int(want):
        torch.ops.memr1.gae_cpu_simd(before)
        pytest.skip("this CPU has no AVX-512: the scalar loop is the only path")
    yield request.param
    torch.ops.memr1.gae_cpu_simd(before)


def within_one_rounding(got, want, dtype):
    """|got - want| within the rounding of a float64 result to `dtype` (float64: the two orders of
    summation's own spread, well under 1e-10 at these sizes)."""
    ulp = 2.0 ** -24 if dtype == torch.float32 else 0.0
    return ((got.double() - want).abs() <= want.abs() * ulp + 1e-10).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_native_matches_python_loop_within_one_rounding(poisoned, native_path, dtype):
    """The C++ paths run in float64 and round each output once, so against the scalar float64 loop a
    float32 result may differ only by that rounding (and a float64 one by the two loops' own spread)."""
    n, T = 37, 300
    seed = secrets.randbelow(2**31)
    r, v, m = batch(n, T, dtype, "cpu", seed)
    boot = torch.randn(n, dtype=dtype)
    for values, b, mask in ((v, v[:, -1], m), (v[:, :T], boot, m), (v[:, :T], None, m.to(torch.uint8)),
                            (v, v[:, -1], m.float())):
        kw = {} if b is None or values.shape[1] == T + 1 else dict(bootstrap=b)
        a, ret = gae(r, values, mask, 0.99, 0.95, impl="native", **kw)
        b64 = torch.zeros(n, dtype=torch.float64) if b is None else b.double()
        a_py, ret_py = python_gae(r.double().tolist(), values.double().tolist(), (mask != 0).tolist(),
                                  0.99, 0.95, b64.tolist())
        assert a.dtype == dtype and ret.dtype == dtype
        for got, want in ((a, a_py), (ret, ret_py)):
            assert within_one_rounding(got, want, dtype), f"seed {seed}"
        assert (a[mask == 0] == 0).all() and (ret[mask == 0] == 0).all()


@pytest.mark.parametrize("T", [1, 5, 8, 13, 64, 67, 130])
def test_native_paths_on_every_chunk_shape(poisoned, native_path, T):
    """The scan works on chunks of eight steps from the start of a row and zeroes the padding after a
    row's last real step in bulk: rows shorter than a chunk, a partial last chunk, rows of whole
    chunks, and masks that are empty, full, ragged, holed at random, or real only in the partial last
    chunk or only in the first step."""
    n = 24
    g = torch.Generator().manual_seed(T)
    r, v = torch.randn(n, T, generator=g, dtype=torch.float64), torch.randn(n, T + 1, generator=g, dtype=torch.float64)
    mask = torch.arange(T)[None, :] < torch.randint(0, T + 1, (n,), generator=g)[:, None]
    mask[::3] &= torch.rand(n, T, generator=g)[::3] > 0.4  # every third row holed at random
    mask[0], mask[1], mask[2], mask[3] = False, True, False, False
    mask[2, -1] = True  # only the very last step real
    mask[3, 0] = True  # only the first
    for dtype in (torch.float32, torch.float64):
        rd, vd = r.to(dtype), v.to(dtype)
        a, ret = gae(rd, vd, mask, 0.99, 0.95, impl="native")
        a_py, ret_py = python_gae(rd.double().tolist(), vd.double().tolist(), mask.tolist(), 0.99, 0.95,
                                  vd[:, -1].double().tolist())
        assert within_one_rounding(a, a_py, dtype) and within_one_rounding(ret, ret_py, dtype), (T, dtype)
        assert (a[~mask] == 0).all() and (ret[~mask] == 0).all()


def test_native_streamed_outputs_match_the_loop():
    """Outputs of 8 MiB and more are written with non-temporal stores (the scan's path for large
    batches); the result is the scalar loop's, to float32 rounding."""
    need("cpu", "native")
    before = torch.ops.memr1.gae_cpu_simd(-1)
    if not torch.ops.memr1.gae_cpu_simd(1):
        pytest.skip("this CPU has no AVX-512: no streamed path")
    try:
        r, v, m = batch(1024, 1024, torch.float32, "cpu", seed=5)  # 2 x 4 MiB of outputs
        a, ret = gae(r, v, m, 0.99, 0.95, impl="native")
        torch.ops.memr1.gae_cpu_simd(0)
        a_loop, ret_loop = gae(r, v, m, 0.99, 0.95, impl="native")
    finally:
        torch.ops.memr1.gae_cpu_simd(before)
    for got, want in ((a, a_loop), (ret, ret_loop)):
        assert ((got.double() - want.double()).abs() <= want.double().abs() * 2.0 ** -23 + 1e-6).all()
    assert (a[~m] == 0).all() and (ret[~m] == 0).all()


def test_native_compiles_into_one_graph():
    """Under torch.compile the C++ path is an operator in the caller's graph, its shape function
    keeps N and T symbolic (no recompile for another batch)."""
    need("cpu", "native")
    fn = torch.compile(lambda r, v, m: gae(r, v, m, 0.99, 0.95)[0] * 2, fullgraph=True, dynamic=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for seed, (n, T) in enumerate(((5, 9), (7, 12))):
            r, v, m = batch(n, T, torch.float32, "cpu", seed)
            assert torch.equal(fn(r, v, m), gae(r, v, m, 0.99, 0.95, impl="native")[0] * 2)


@pytest.mark.parametrize("impl", GAE_IMPLS)
def test_strided_inputs(impl):
    """Column-major views: the C++ operator takes its scalar loop for steps that are not contiguous."""
    need("cpu", impl)
    r, v, m = batch(20, 16, torch.float32, "cpu", seed=3)
    rt, vt, mt = r.T.contiguous().T, v.T.contiguous().T, m.T.contiguous().T  # column-major views
    a, ret = gae(rt, vt, mt, 0.9, 0.8, impl=impl)
    a_ref, ret_ref = gae_ref(r, v, m, 0.9, 0.8)
    torch.testing.assert_close(a, a_ref)
    torch.testing.assert_close(ret, ret_ref)


def test_whiten_statistics():
    r, v, m = batch(30, 20, torch.float64, "cpu", seed=4)
    a, _ = gae(r, v, m, 0.99, 0.95, whiten=True)
    real = a[m]
    assert abs(real.mean().item()) < 1e-10 and abs(real.std().item() - 1) < 1e-6
    assert (a[~m] == 0).all()


def test_bad_arguments_are_named():
    r, v, m = torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool)
    cases = [
        ((r[0], v, m, 0.9, 0.9), {}, "rewards"),
        ((r, torch.zeros(2, 5), m, 0.9, 0.9), {}, "values"),
        ((r, v, m[:, :2], 0.9, 0.9), {}, "mask"),
        ((r, v, m, 1.5, 0.9), {}, "gamma"),
        ((r, v, m, 0.9, -0.1), {}, "lam"),
        ((r, v, m, 0.9, 0.9), {"bootstrap": torch.zeros(2)}, "bootstrap"),
        ((r, v[:, :3], m, 0.9, 0.9), {"bootstrap": torch.zeros(3)}, "bootstrap"),
    ]
    for args, kw, word in cases:
        for impl in (IMPLS if interpreting() else ["torch"]) + ["native"]:
            with pytest.raises(ValueError, match=word):
                gae(*args, impl=impl, **kw)
