"""rl.algos.losses: aggregation modes, KL estimators, clip / dual-clip / importance branches, value loss."""
import math

import pytest
import torch

from memr1.rl.algos.config import GRPOConfig, LossConfig, dr_grpo
from memr1.rl.algos.grpo import grpo_advantages
from memr1.rl.algos.losses import Denom, aggregate, kl_penalty, policy_loss, value_loss

# Two sequences: tokens [1, 2, 3] and [4, 5].
VALUES = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
SEQ = torch.tensor([0, 0, 0, 1, 1])
DENOM = Denom(tokens=5, seqs=2, horizon=4)


@pytest.mark.parametrize("mode,expected", [
    ("token-mean", 15 / 5),
    ("seq-mean-token-sum", (6 + 9) / 2),
    ("seq-mean-token-mean", (6 / 3 + 9 / 2) / 2),
    ("seq-mean-token-sum-norm", (6 + 9) / (2 * 4)),
])
def test_aggregation_hand_computed_and_split_invariant(mode, expected):
    assert aggregate(VALUES, SEQ, 2, mode, DENOM).item() == pytest.approx(expected)
    # The same step split into two micro-batches (one sequence each) with the global denominators.
    first = aggregate(VALUES[:3], torch.zeros(3, dtype=torch.long), 1, mode, DENOM)
    second = aggregate(VALUES[3:], torch.zeros(2, dtype=torch.long), 1, mode, DENOM)
    assert (first + second).item() == pytest.approx(expected)


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="aggregation"):
        LossConfig(aggregation="mean")
    with pytest.raises(ValueError, match="kl_estimator"):
        LossConfig(kl_estimator="k4")
    with pytest.raises(ValueError, match="horizon"):
        LossConfig(aggregation="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="dual_clip"):
        LossConfig(dual_clip=0.5)


def test_kl_estimators_against_exact_categorical_kl():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64), 0)
    q = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64) * 0.5, 0)
    exact = (p * (p / q).log()).sum().item()
    x = torch.multinomial(p, 400_000, replacement=True, generator=g)
    logp, logq = p.log()[x], q.log()[x]
    k1 = kl_penalty(logp, logq, "k1").mean().item()
    k3 = kl_penalty(logp, logq, "k3").mean().item()
    k2 = kl_penalty(logp, logq, "k2").mean().item()
    k2_expect = (p * 0.5 * (p / q).log().square()).sum().item()
    assert k1 == pytest.approx(exact, rel=0.03)
    assert k3 == pytest.approx(exact, rel=0.03)  # unbiased
    assert k2 == pytest.approx(k2_expect, rel=0.03)
    assert (kl_penalty(logp, logq, "k3") >= 0).all() and (kl_penalty(logp, logq, "k2") >= 0).all()
    # k3 is clamped at 10 when the reference is far likelier than the policy.
    assert kl_penalty(torch.tensor([-30.0]), torch.tensor([0.0]), "k3").item() == 10.0


def _one_token(ratio, adv, cfg, behav_shift=None):
    old = torch.tensor([-1.0])
    logp = (old + math.log(ratio)).requires_grad_(True)
    behav = None if behav_shift is None else old - behav_shift
    loss, m = policy_loss(logp, old, torch.tensor([adv]), torch.zeros(1, dtype=torch.long), 1,
                          Denom(1, 1), cfg, behav_logp=behav)
    loss.backward()
    return loss.item(), logp.grad.item(), m


def test_unclipped_surrogate_has_policy_gradient():
    loss, grad, m = _one_token(1.1, 2.0, LossConfig())
    assert loss == pytest.approx(-2.0 * 1.1) and grad == pytest.approx(-2.0 * 1.1)
    assert m["clip_frac"].item() == 0


def test_clip_high_and_low_branches():
    cfg = LossConfig(clip_low=0.2, clip_high=0.28)
    loss, grad, m = _one_token(1.5, 1.0, cfg)  # A > 0, ratio above 1 + clip_high
    assert loss == pytest.approx(-1.28) and grad == 0.0 and m["clip_frac"].item() == 1
    loss, grad, _ = _one_token(1.25, 1.0, cfg)  # inside the asymmetric band: not clipped
    assert loss == pytest.approx(-1.25) and grad != 0.0
    loss, grad, m = _one_token(0.5, -1.0, cfg)  # A < 0, ratio below 1 - clip_low
    assert loss == pytest.approx(0.8) and grad == 0.0 and m["clip_frac"].item() == 1


def test_dual_clip_bounds_negative_advantages():
    loss, grad, m = _one_token(5.0, -1.0, LossConfig(dual_clip=3.0))
    assert loss == pytest.approx(3.0) and grad == 0.0 and m["dual_clip_frac"].item() == 1
    loss, _, m = _one_token(5.0, -1.0, LossConfig(dual_clip=0.0))
    assert loss == pytest.approx(5.0) and m["dual_clip_frac"].item() == 0


def test_truncated_importance_weight_and_decoupled_drop():
    # old - behav = log 5: weight 5, truncated to the cap 2.
    loss, _, _ = _one_token(1.0, 1.0, LossConfig(is_cap=2.0), behav_shift=math.log(5))
    assert loss == pytest.approx(-2.0)
    loss, _, _ = _one_token(1.0, 1.0, LossConfig(is_cap=2.0), behav_shift=math.log(1.5))
    assert loss == pytest.approx(-1.5)
    loss, grad, m = _one_token(1.0, 1.0, LossConfig(is_cap=2.0, decoupled=True), behav_shift=math.log(5))
    assert loss == 0.0 and grad == 0.0 and m["dropped_frac"].item() == 1
    loss, _, _ = _one_token(1.0, 1.0, LossConfig(is_cap=0.0), behav_shift=math.log(5))
    assert loss == pytest.approx(-1.0)


def test_kl_term_is_added_to_the_loss():
    logp = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-1.5, -1.0])
    cfg = LossConfig(kl_coef=0.5, kl_estimator="k1")
    loss, m = policy_loss(logp, logp, torch.zeros(2), torch.tensor([0, 0]), 1, Denom(2, 1), cfg, ref_logp=ref)
    assert loss.item() == pytest.approx(0.5 * ((0.5) + (-1.0)) / 2)
    assert m["kl"].item() == pytest.approx(-0.5)


def test_all_zero_advantages_give_zero_loss_not_nan():
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    loss, _ = policy_loss(logp, logp.detach(), torch.zeros(2), torch.tensor([0, 1]), 2, Denom(2, 2), LossConfig())
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logp.grad, torch.zeros(2))


def test_clipped_value_loss():
    values, old, ret = torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.0]), torch.tensor([0.0, 0.1])
    loss = value_loss(values, old, ret, torch.tensor([0, 0]), 1, Denom(2, 1), LossConfig(value_clip=0.2))
    # token 0: unclipped (1-0)^2=1, clipped 0.7^2=0.49 -> 1; token 1: 0.01 both -> mean of halves
    assert loss.item() == pytest.approx(0.5 * (1.0 + 0.01) / 2)


def test_grpo_std_conventions_and_dr_grpo():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    gid = torch.tensor([0, 0, 0, 1, 1, 1])
    unbiased = grpo_advantages(r, gid, GRPOConfig(std="unbiased", eps=0.0))
    population = grpo_advantages(r, gid, GRPOConfig(std="population", eps=0.0))
    none = grpo_advantages(r, gid, GRPOConfig(std="none"))
    centred = torch.tensor([2 / 3, -1 / 3, -1 / 3, 0, 0, 0])
    assert torch.allclose(none, centred, atol=1e-6)
    assert torch.allclose(unbiased, centred / torch.tensor([1 / 3]).sqrt() * torch.tensor([1, 1, 1, 0, 0, 0]), atol=1e-5)
    assert torch.allclose(population, centred / torch.tensor([2 / 9]).sqrt() * torch.tensor([1, 1, 1, 0, 0, 0]), atol=1e-5)
    grpo, loss = dr_grpo(horizon=128)
    assert grpo.std == "none" and loss.aggregation == "seq-mean-token-sum-norm" and loss.horizon == 128
    with pytest.raises(ValueError, match="std"):
        GRPOConfig(std="sample")


def test_call_level_ratio_clips_a_calls_tokens_together():
    """ratio_level = "call": every token of a sequence carries exp(mean log-ratio of the sequence), and
    the behaviour importance weight likewise, against a reference computed per sequence by hand."""
    logp = torch.tensor([-1.0, -2.0, -0.5, -1.5, -3.0], requires_grad=True)
    old = torch.tensor([-1.2, -1.5, -0.6, -1.0, -3.4])
    behav = torch.tensor([-1.1, -1.6, -0.4, -1.2, -3.0])
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0])
    cfg = LossConfig(ratio_level="call", clip_low=0.1, clip_high=0.1, dual_clip=0.0)
    loss, m = policy_loss(logp, old, adv, SEQ, 2, DENOM, cfg, behav_logp=behav)
    expected = 0.0
    for seq in (0, 1):
        idx = (SEQ == seq).nonzero().flatten()
        r = math.exp((logp[idx] - old[idx]).mean().item())
        w = min(math.exp((old[idx] - behav[idx]).mean().item()), cfg.is_cap)
        a = adv[idx[0]].item()
        per_token = max(-a * r, -a * min(max(r, 0.9), 1.1)) * w
        expected += per_token * len(idx)
    assert loss.item() == pytest.approx(expected / 5, rel=1e-6)
    assert m["ratio"].item() == pytest.approx(3 * math.exp((logp[:3] - old[:3]).mean().item())
                                              + 2 * math.exp((logp[3:] - old[3:]).mean().item()), rel=1e-6)
    # with one token per sequence the two levels are the same loss
    one = torch.arange(5)
    token, _ = policy_loss(logp, old, adv, one, 5, Denom(tokens=5, seqs=5), LossConfig(), behav_logp=behav)
    call, _ = policy_loss(logp, old, adv, one, 5, Denom(tokens=5, seqs=5), LossConfig(ratio_level="call"),
                          behav_logp=behav)
    assert call.item() == pytest.approx(token.item())
