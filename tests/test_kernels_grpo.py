"""grpo_advantage: the Triton kernels and the C++ CPU path against the torch reference, and the reference
against hand math."""
import math
import secrets

import pytest
import torch

from memr1.kernels import grpo_advantage, grpo_advantage_ref
from kernel_helpers import DEVICES, GRPO_IMPLS, need


def ragged(device, dtype, seed, offset=0.0):
    """Groups of 1..64 members with shuffled ids and some unused ids; N is no multiple of a tile."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 65, (40,), generator=g)
    sizes[:3] = torch.tensor([1, 1, 64])
    if int(sizes.sum()) % 32 == 0:  # keep N off every tile size (32 rows, 1024 sequences)
        sizes[0] = 2
    num_groups = len(sizes) + 7  # ids that no sequence uses: empty groups
    ids = torch.randperm(num_groups, generator=g)[: len(sizes)]
    group_ids = ids.repeat_interleave(sizes)
    group_ids = group_ids[torch.randperm(len(group_ids), generator=g)]
    n = len(group_ids)
    rewards = offset + torch.rand(n, generator=g, dtype=torch.float64)
    rewards[group_ids == ids[3]] = 0.5  # one all-equal group
    lengths = torch.randint(0, 50, (n,), generator=g)
    lengths[:5] = 0  # zero-length responses
    T = 77
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return rewards.to(device, dtype), group_ids.to(device), num_groups, mask.to(device), lengths


def spread(r, gid, offset: float) -> torch.Tensor:
    """Per reward: how far two float64 computations of its advantage may drift apart, 16 roundings of
    the reward's size over its group's std (1e-10 at least)."""
    r = r.double()
    std = torch.ones_like(r)
    for g in gid.unique():
        members = gid == g
        if members.sum() > 1:
            std[members] = r[members].std(unbiased=False).clamp(min=1e-300)
    return (16 * 2.0 ** -52 * (abs(offset) + 1) / std).clamp(min=1e-10)


def rel_err(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1)).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("std,baseline", [("unbiased", "mean"), ("population", "mean"),
                                          ("none", "mean"), ("unbiased", "loo"), ("none", "loo")])
def test_triton_matches_reference_fp32(poisoned, device, std, baseline):
    need(device, "triton")
    seed = secrets.randbelow(2**31)
    r, gid, G, mask, _ = ragged(device, torch.float32, seed)
    kw = dict(response_mask=mask, std=std, baseline=baseline)
    a_ref, t_ref = grpo_advantage(r, gid, G, impl="torch", **kw)
    a, t = grpo_advantage(r, gid, G, impl="triton", **kw)
    assert not torch.isnan(a).any() and not torch.isnan(t).any(), f"seed {seed}"
    assert rel_err(a, a_ref) <= 1e-5 and rel_err(t, t_ref) <= 1e-5, f"seed {seed}"
    assert (t[~mask] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_triton_matches_reference_fp64_and_packed(poisoned, device):
    need(device, "triton")
    seed = secrets.randbelow(2**31)
    r, gid, G, _, lengths = ragged(device, torch.float64, seed)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]) + 3  # starts at 3
    total = int(offsets[-1]) + 5  # a tail past the last sequence
    a_ref, t_ref = grpo_advantage(r, gid, G, token_offsets=offsets, total_tokens=total, impl="torch")
    a, t = grpo_advantage(r, gid, G, token_offsets=offsets.to(device), total_tokens=total,
                          impl="triton")
    assert a.dtype == torch.float64 and t.shape == (total,)
    assert rel_err(a, a_ref) <= 1e-12 and rel_err(t, t_ref) <= 1e-12, f"seed {seed}"
    assert (t[:3] == 0).all() and (t[-5:] == 0).all()
    i = int(torch.argmax(lengths))
    assert torch.equal(t[offsets[i]:offsets[i + 1]].cpu(), a[i].cpu().expand(int(lengths[i])))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("std,baseline", [("unbiased", "mean"), ("population", "mean"),
                                          ("none", "mean"), ("unbiased", "loo"), ("none", "loo")])
def test_native_matches_reference_within_one_output_rounding(poisoned, dtype, std, baseline):
    """The C++ path sums in float64, so against the float64 reference on the same rewards a float32
    result may only differ by its final rounding, plus the two float64 computations' own spread: the
    rounding of a reward of size |r| (2^-52 |r|) divided by its group's std, which is about 1e-11 for a
    1e4 offset and a typical group but grows without bound as two members' rewards get close. The token
    broadcasts match the reference's."""
    need("cpu", "native")
    seed = secrets.randbelow(2**31)
    offset = float(seed % 2) * 1e4
    r, gid, G, mask, lengths = ragged("cpu", dtype, seed, offset=offset)
    kw = dict(std=std, baseline=baseline)
    truth, _ = grpo_advantage_ref(r.double(), gid, G, **kw)
    a, t = grpo_advantage(r, gid, G, response_mask=mask, impl="native", **kw)
    assert a.dtype == dtype
    ulp = 2.0 ** -24 if dtype == torch.float32 else 0.0
    assert ((a.double() - truth).abs() <= truth.abs() * ulp + spread(r, gid, offset)).all(), f"seed {seed}"
    assert torch.equal(t, torch.where(mask, a[:, None], 0.0))
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    _, packed = grpo_advantage(r, gid, G, token_offsets=offsets, impl="native", **kw)
    assert torch.equal(packed, a.repeat_interleave(lengths))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_native_matches_reference_past_l2(dtype):
    """A group table of 12-16 MB, past any core's L2, takes the prefetching passes; a group of 300
    members, past the reciprocal table, divides. Both must agree with the float64 reference as the
    small batches do, with out-of-range ids still NaN and all-equal pairs exactly 0."""
    need("cpu", "native")
    seed = secrets.randbelow(2**31)
    g = torch.Generator().manual_seed(seed)
    num_groups = 1 << 19
    gid = torch.arange(num_groups).repeat_interleave(2)
    gid[:300] = 7  # one group of 300; groups 0..149 other than 7 are left empty
    gid = torch.cat([gid, torch.tensor([-1, num_groups])])[torch.randperm(len(gid) + 2, generator=g)]
    # On a 1/64 grid: with 1M pairs some would otherwise differ by ~1e-6, where a 1e4 offset's rounding
    # (1.8e-12 in float64) is magnified to ~1e-6 in any two float64 computations alike.
    grid = torch.randint(0, 64, (len(gid),), generator=g, dtype=torch.float64) / 64
    r = (1e4 * (seed % 2) + grid).to(dtype)
    truth, _ = grpo_advantage_ref(r.double(), gid, num_groups)
    a, _ = grpo_advantage(r, gid, num_groups, impl="native")
    outside = (gid < 0) | (gid >= num_groups)
    assert torch.isnan(a[outside]).all() and not torch.isnan(a[~outside]).any(), f"seed {seed}"
    ulp = 2.0 ** -24 if dtype == torch.float32 else 0.0
    err = (a[~outside].double() - truth[~outside]).abs() - truth[~outside].abs() * ulp
    assert (err <= 1e-10).all(), f"seed {seed}"
    ids = gid[~outside]
    lo = r.new_full((num_groups,), math.inf).scatter_reduce(0, ids, r[~outside], "amin")
    hi = r.new_full((num_groups,), -math.inf).scatter_reduce(0, ids, r[~outside], "amax")
    assert (a[~outside][lo[ids] == hi[ids]] == 0).all(), f"seed {seed}"  # all-equal groups


def test_native_compiles_into_one_graph_for_every_batch_size():
    """Under torch.compile the C++ path is an operator inside the caller's graph (no break), and its
    shape function keeps the batch size and group count symbolic (no recompile per batch)."""
    need("cpu", "native")
    fn = torch.compile(lambda r, g, k, m: grpo_advantage(r, g, k, response_mask=m)[1] * 2,
                       fullgraph=True, dynamic=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for seed, empty_groups in ((5, 0), (6, 3)):  # another N and another group count
            r, gid, G, mask, _ = ragged("cpu", torch.float32, seed=seed)
            G += empty_groups
            want = grpo_advantage(r, gid, G, response_mask=mask, impl="native")[1] * 2
            assert torch.equal(fn(r, gid, G, mask), want)


def test_native_takes_half_rewards_and_rewards_that_require_grad():
    """The C++ path computes half and bfloat16 rewards in float32, as the reference does, and never
    hands autograd a graph: advantages are constants of the loss."""
    need("cpu", "native")
    r, gid, G, _, _ = ragged("cpu", torch.float32, seed=7)
    for low in (torch.float16, torch.bfloat16):
        got = grpo_advantage(r.to(low), gid, G, impl="native")[0]
        assert got.dtype == torch.float32
        assert torch.equal(got, grpo_advantage(r.to(low).float(), gid, G, impl="native")[0])
    leaf = r.clone().requires_grad_()
    got = grpo_advantage(leaf, gid, G, impl="native")[0]
    assert not got.requires_grad and torch.equal(got, grpo_advantage(r, gid, G, impl="native")[0])


def test_native_operator_names_bad_arguments():
    """The operator checks what the Python wrapper would have (a direct torch.ops caller skips it)."""
    need("cpu", "native")
    op = torch.ops.memr1.grpo_advantage_cpu
    r, g = torch.rand(4), torch.tensor([0, 0, 1, 1])
    for args, word in [((r[None], g), "rewards must be 1-D"), ((r.half(), g), "float32 or float64"),
                       ((r, g[:3]), "one id per reward"), ((r, g.float()), "integer tensor")]:
        with pytest.raises(RuntimeError, match=word):
            op(*args, 2, 0, False, 1e-6)
    with pytest.raises(RuntimeError, match="num_groups"):
        op(r, g, -1, 0, False, 1e-6)
    # int32 ids and a strided view are taken as they are
    torch.testing.assert_close(op(r[::1], g.int(), 2, 0, False, 1e-6), op(r, g, 2, 0, False, 1e-6))
    wide = torch.rand(8)
    torch.testing.assert_close(op(wide[::2], g, 2, 0, False, 1e-6), op(wide[::2].clone(), g, 2, 0, False, 1e-6))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", GRPO_IMPLS)
def test_hand_computed(device, impl):
    need(device, impl)
    # group 2 = [1, 2, 3, 4]; group 0 = singleton 7; group 1 = all-equal [5, 5, 5]
    r = torch.tensor([1.0, 7.0, 2.0, 5.0, 3.0, 5.0, 4.0, 5.0], dtype=torch.float64, device=device)
    g = torch.tensor([2, 0, 2, 1, 2, 1, 2, 1], device=device)
    centred = torch.tensor([-1.5, -0.5, 0.5, 1.5], dtype=torch.float64)
    expect = {"unbiased": centred / (math.sqrt(5 / 3) + 1e-6),
              "population": centred / (math.sqrt(5 / 4) + 1e-6),
              "none": centred}
    for std, want in expect.items():
        a, tok = grpo_advantage(r, g, 3, std=std, impl=impl)
        assert tok is None
        torch.testing.assert_close(a[[0, 2, 4, 6]].cpu(), want, rtol=1e-12, atol=1e-12)
        assert a[1] == 0 and (a[[3, 5, 7]] == 0).all()  # singleton and all-equal: exactly 0
    # RLOO: baselines of [1, 2, 3, 4] are the means of the other three: 3, 8/3, 7/3, 2
    a, _ = grpo_advantage(r, g, 3, std="none", baseline="loo", impl=impl)
    want = torch.tensor([1 - 3, 2 - 8 / 3, 3 - 7 / 3, 4 - 2], dtype=torch.float64)
    torch.testing.assert_close(a[[0, 2, 4, 6]].cpu(), want, rtol=1e-12, atol=1e-12)
    assert a[1] == 0 and (a[[3, 5, 7]] == 0).all()
    # eps=0 must still give 0 (not NaN) on an all-equal group
    a, _ = grpo_advantage(r, g, 3, eps=0.0, impl=impl)
    assert a[1] == 0 and (a[[3, 5, 7]] == 0).all() and torch.isfinite(a).all()


@pytest.mark.parametrize("impl", GRPO_IMPLS)
def test_large_offset_keeps_accuracy(impl):
    need("cpu", impl)
    r64, gid, G, _, _ = ragged("cpu", torch.float64, seed=secrets.randbelow(2**31), offset=1e4)
    truth, _ = grpo_advantage_ref(r64, gid, G)
    a, _ = grpo_advantage(r64.float(), gid, G, impl=impl)
    # fp32 holds 1e4 + U(0,1) to half an ulp (2^-11) absolute; the shifted two-pass statistics add
    # nothing on top of that input rounding, which moves r - mean by up to 2 * 2^-11 and the std by up
    # to sqrt(n / (n - 1)) * 2^-11 <= 1.5 * 2^-11, so an advantage by (2 + 1.5 |a|) * 2^-11 / std: a
    # bound per group, since a group's std may be small.
    inherent, _ = grpo_advantage_ref(r64.float().double(), gid, G)
    assert (a.double() - inherent).abs().max() < 1e-5
    n = torch.zeros(G, dtype=torch.float64).index_add_(0, gid, torch.ones_like(r64))
    mean = torch.zeros(G, dtype=torch.float64).index_add_(0, gid, r64) / n.clamp(min=1)
    ss = torch.zeros(G, dtype=torch.float64).index_add_(0, gid, (r64 - mean[gid]) ** 2)
    std = (ss / (n - 1).clamp(min=1)).sqrt()[gid]
    input_rounding = (2 + 1.5 * truth.abs()) * 2.0 ** -11 / std.clamp(min=1e-300) * 1.05
    assert ((a.double() - truth).abs() <= input_rounding).all()


@pytest.mark.parametrize("impl", GRPO_IMPLS)
def test_validate_names_the_bad_index(impl):
    need("cpu", impl)
    r = torch.rand(12)
    g = torch.arange(12) % 3
    r[5] = math.nan
    with pytest.raises(ValueError, match=r"rewards\[5\]"):
        grpo_advantage(r, g, 3, validate=True, impl=impl)
    r[5], r[9] = 0.0, math.inf
    with pytest.raises(ValueError, match=r"rewards\[9\]"):
        grpo_advantage(r, g, 3, validate=True, impl=impl)
    r[9] = 0.0
    g[7] = 3
    with pytest.raises(ValueError, match=r"group_ids\[7\]"):
        grpo_advantage(r, g, 3, validate=True, impl=impl)
    a, _ = grpo_advantage(r, g, 3, impl=impl)  # unvalidated: the stray row is NaN, the rest finite
    assert torch.isnan(a[7]) and torch.isfinite(a[torch.arange(12) != 7]).all()
    with pytest.raises(ValueError, match="token_offsets"):
        grpo_advantage(r, g % 3, 3, token_offsets=torch.tensor([0, 2, 1] + [3] * 10), validate=True,
                       impl=impl)


def test_bad_arguments_are_named():
    r, g = torch.rand(4), torch.tensor([0, 0, 1, 1])
    cases = [
        (dict(rewards=r[None]), "rewards"),
        (dict(group_ids=g.float()), "group_ids"),
        (dict(group_ids=g[:3]), "group_ids"),
        (dict(num_groups=-1), "num_groups"),
        (dict(num_groups=2.0), "num_groups"),
        (dict(std="sample"), "std"),
        (dict(baseline="median"), "baseline"),
        (dict(eps=-1.0), "eps"),
        (dict(response_mask=torch.ones(3, 5)), "response_mask"),
        (dict(token_offsets=torch.arange(4)), "token_offsets"),
        (dict(impl="cuda"), "impl"),
        (dict(rewards=r.to("meta"), group_ids=g.to("meta"), impl="native"), "CPU tensors"),
    ]
    for change, word in cases:
        args = dict(rewards=r, group_ids=g, num_groups=2) | change
        with pytest.raises(ValueError, match=word):
            grpo_advantage(args.pop("rewards"), args.pop("group_ids"), args.pop("num_groups"), **args)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", GRPO_IMPLS)
def test_no_host_sync_on_cuda(impl):
    need("cuda", impl)
    r, gid, G, mask, lengths = ragged("cuda", torch.float32, seed=1)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).cuda()
    grpo_advantage(r, gid, G, response_mask=mask, impl=impl)  # compile outside the check
    grpo_advantage(r, gid, G, token_offsets=offsets, total_tokens=int(lengths.sum()), impl=impl)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        grpo_advantage(r, gid, G, response_mask=mask, impl=impl)
        grpo_advantage(r, gid, G, token_offsets=offsets, total_tokens=int(lengths.sum()), impl=impl)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def run_with_module_missing(module, code):
    """Run `code` in a fresh interpreter where `module` cannot be imported, as in an install without
    it; `code` may call raises(fn, cls, word) to check that fn raises cls naming `word`."""
    import subprocess
    import sys
    prelude = (
        f"import sys; sys.modules[{module!r}] = None\n"
        "def raises(fn, cls, word):\n"
        "    try:\n"
        "        fn()\n"
        "    except cls as e:\n"
        "        assert word in str(e), e\n"
        "    else:\n"
        "        raise SystemExit(f'{fn} did not raise {cls.__name__}')\n"
        "import torch\n"
        "from memr1.kernels import grpo_advantage\n"
    )
    res = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_imports_and_runs_without_triton():
    """A CPU-only install: no triton at all. The package imports; auto runs the CPU paths."""
    run_with_module_missing("triton", (
        "from memr1.kernels import gae, logprobs\n"
        "a, _ = grpo_advantage(torch.tensor([1., 2.]), torch.tensor([0, 0]), 1)\n"
        "assert a.tolist() == [a[0].item(), -a[0].item()] and a[0] < 0\n"
        "raises(lambda: grpo_advantage(torch.tensor([1.]), torch.tensor([0]), 1, impl='triton'),\n"
        "       RuntimeError, 'not installed')\n"))


def test_runs_without_the_native_module():
    """A source tree that skipped the C++ build: auto falls back to the torch reference on CPU, and
    asking for the native path names what is missing."""
    run_with_module_missing("memr1.kernels._native", (
        "from memr1.kernels._dispatch import resolve_impl\n"
        "assert resolve_impl('auto', torch.device('cpu'), native=True) == 'torch'\n"
        "a, _ = grpo_advantage(torch.tensor([1., 2.]), torch.tensor([0, 0]), 1)\n"
        "assert a[0] < 0 < a[1]\n"
        "raises(lambda: grpo_advantage(torch.tensor([1.]), torch.tensor([0]), 1, impl='native'),\n"
        "       RuntimeError, 'not built')\n"))


def test_native_is_offered_only_where_a_kernel_has_it():
    from memr1.kernels import logprobs
    with pytest.raises(ValueError, match="not offered"):
        logprobs(torch.rand(4, 8), torch.rand(16, 8), torch.zeros(4, dtype=torch.long), impl="native")
