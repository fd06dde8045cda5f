"""Policy and value losses for PPO-style RL on LLMs.

Every function works on *flat* response tokens: one entry per trained token, with `seq_ids` telling which
sequence (0..num_seqs-1 within the micro-batch) each token belongs to. That one layout serves packed and
padded batches alike.

Aggregation divides by GLOBAL denominators (`Denom`: token count, sequence count, horizon over the whole
step, all data-parallel ranks and micro-batches). Each micro-batch then returns its share of the global
mean, and the shares sum to the same loss however the batch was split.
"""
from __future__ import annotations

import msgspec
import torch

from memr1.rl.algos.config import AGGREGATIONS, LossConfig


class Denom(msgspec.Struct, frozen=True):
    """Global normalisers of one optimizer step (summed over all ranks and micro-batches)."""
    tokens: float
    seqs: float
    horizon: int = 0


def aggregate(values: torch.Tensor, seq_ids: torch.Tensor, num_seqs: int, mode: str, denom: Denom) -> torch.Tensor:
    """Reduce per-token `values` [M] to this micro-batch's share of the global loss."""
    if mode == "token-mean":
        return values.sum() / max(denom.tokens, 1.0)
    if mode == "seq-mean-token-sum":
        return values.sum() / max(denom.seqs, 1.0)
    if mode == "seq-mean-token-mean":
        # A sequence never spans micro-batches, so its length is local.
        lengths = torch.bincount(seq_ids, minlength=num_seqs).clamp(min=1).to(values.dtype)
        return (values / lengths[seq_ids]).sum() / max(denom.seqs, 1.0)
    if mode == "seq-mean-token-sum-norm":
        return values.sum() / (max(denom.seqs, 1.0) * denom.horizon)
    raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGGREGATIONS}")


def per_call_mean(values: torch.Tensor, seq_ids: torch.Tensor, num_seqs: int) -> torch.Tensor:
    """Each token's value replaced by its sequence's mean (a sequence never spans micro-batches)."""
    sums = values.new_zeros(num_seqs).index_add(0, seq_ids, values)
    counts = torch.bincount(seq_ids, minlength=num_seqs).clamp(min=1).to(values.dtype)
    return (sums / counts)[seq_ids]


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from tokens sampled from pi (Schulman's k1/k2/k3)."""
    log_ratio = logp - ref_logp
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        # ref/pi - 1 - log(ref/pi): unbiased and always >= 0; clamped because exp() explodes.
        return ((-log_ratio).exp() - 1 + log_ratio).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL estimator {estimator!r}; expected k1, k2 or k3")


def policy_loss(logp, old_logp, advantages, seq_ids, num_seqs: int, denom: Denom, cfg: LossConfig, *,
                behav_logp=None, ref_logp=None, entropy=None):
    """Clipped surrogate (+ dual clip, importance correction, KL, entropy) on flat response tokens.

    logp: current policy [M] (with grad); old_logp: the learner's policy before this step (the proximal
    policy in decoupled mode); behav_logp: what the generator sampled with. Returns (loss, metrics), where
    metrics are detached local sums for the caller to normalise.
    """
    advantages = advantages.to(logp.dtype)
    log_ratio = logp - old_logp
    if cfg.ratio_level == "call":
        log_ratio = per_call_mean(log_ratio, seq_ids, num_seqs)
    log_ratio = log_ratio.clamp(-cfg.log_ratio_clamp, cfg.log_ratio_clamp)
    ratio = log_ratio.exp()
    surr = -advantages * ratio
    surr_clipped = -advantages * ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    per_token = torch.maximum(surr, surr_clipped)
    clipped = surr_clipped > surr
    if cfg.dual_clip:
        # For A < 0 a huge ratio makes the loss unbounded; cap it at -c * A.
        bound = -advantages * cfg.dual_clip
        dual = (advantages < 0) & (per_token > bound)
        per_token = torch.where(dual, bound, per_token)
    else:
        dual = torch.zeros_like(clipped)

    keep = torch.ones_like(per_token)
    if behav_logp is not None and cfg.is_cap:
        # NaN marks a token the sampler did not choose (a hint's prefix, rl/task/hints.py): weight 1.
        behav_gap = torch.nan_to_num(old_logp - behav_logp, nan=0.0)
        if cfg.ratio_level == "call":
            behav_gap = per_call_mean(behav_gap, seq_ids, num_seqs)
        weight = behav_gap.clamp(-cfg.log_ratio_clamp, cfg.log_ratio_clamp).exp().detach()
        if cfg.decoupled:
            keep = (weight <= cfg.is_cap).to(per_token.dtype)  # AReaL drops, not truncates, outliers
            per_token = per_token * weight * keep
        else:
            per_token = per_token * weight.clamp(max=cfg.is_cap)

    kl = None
    if ref_logp is not None and cfg.kl_coef and not cfg.kl_in_reward:
        kl = kl_penalty(logp, ref_logp, cfg.kl_estimator)
        per_token = per_token + cfg.kl_coef * kl
    if entropy is not None and cfg.entropy_coef:
        per_token = per_token - cfg.entropy_coef * entropy

    loss = aggregate(per_token, seq_ids, num_seqs, cfg.aggregation, denom)
    with torch.no_grad():  # tensors, not floats: the caller syncs with the host once per step
        zero = per_token.new_zeros(())
        metrics = {
            "clip_frac": clipped.float().sum(),
            "dual_clip_frac": dual.float().sum(),
            "dropped_frac": (1 - keep).sum(),
            "ratio": ratio.detach().sum(),
            "kl": kl.detach().sum() if kl is not None else zero,
            "entropy": entropy.detach().sum() if entropy is not None else zero,
            "nll": -logp.detach().sum(),   # of the trained tokens; a warm start's supervised loss
        }
    return loss, metrics


def value_loss(values, old_values, returns, seq_ids, num_seqs: int, denom: Denom, cfg: LossConfig, mode=None):
    """PPO clipped value loss: 0.5 * max((v - R)^2, (v_clipped - R)^2)."""
    clipped = old_values + (values - old_values).clamp(-cfg.value_clip, cfg.value_clip)
    per_token = 0.5 * torch.maximum((values - returns).square(), (clipped - returns).square())
    return aggregate(per_token, seq_ids, num_seqs, mode or cfg.aggregation, denom)
