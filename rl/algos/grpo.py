"""GRPO: advantages are rewards normalised within each group of completions of one prompt.

GRPO's normalisation over group ids (`grpo_advantages`, kernels/grpo_advantage.py), which advantages.py
applies to every stage kind's groups; then the learner's two steps on a rank's batch: the groups that
carry no signal left out (`drop_zero_advantage_groups`), and each sequence's advantage broadcast to
its tokens in a micro-batch (`token_advantages`).

The std convention is explicit because peers differ silently (verl: unbiased, torchtitan: population,
Dr.GRPO: none). Dr.GRPO also needs a length-independent aggregation, see `config.dr_grpo`.
"""
from __future__ import annotations

import torch

from memr1 import kernels
from memr1.rl.algos.config import GRPOConfig
from memr1.rl.records import TrainBatch


def grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, cfg: GRPOConfig,
                    num_groups: int | None = None) -> torch.Tensor:
    """Per-sequence advantages [N]; the learner broadcasts them to the response tokens."""
    if rewards.ndim != 1 or group_ids.shape != rewards.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must be "
                         "1-D and of equal length")
    if num_groups is None:
        num_groups = int(group_ids.max().item()) + 1 if group_ids.numel() else 0
    seq_adv, _ = kernels.grpo_advantage(rewards.float(), group_ids.long(), num_groups, std=cfg.std,
                                        eps=cfg.eps, baseline=cfg.baseline, validate=True)
    return seq_adv


def drop_zero_advantage_groups(batch: TrainBatch, seq_adv: torch.Tensor) -> tuple[TrainBatch, torch.Tensor]:
    """A group whose advantages are all zero adds nothing to the surrogate (without KL or entropy
    terms), so it need not be computed. The caller keeps the whole batch's denominators, so the
    gradient is exactly the whole batch's."""
    kept, advs, start = [], [], 0
    for g in batch.groups:
        adv = seq_adv[start:start + len(g)]
        if adv.abs().sum() > 0:
            kept.append(g)
            advs.append(adv)
        start += len(g)
    return TrainBatch(kept, batch.weight_version), torch.cat(advs) if advs else seq_adv[:0]


def token_advantages(seq_adv: torch.Tensor, gseq: torch.Tensor, seq_ids: torch.Tensor) -> torch.Tensor:
    """Each token's advantage, its sequence's: `gseq` [S] indexes the micro-batch's sequences into
    `seq_adv`, `seq_ids` [M] gives each token's sequence among those S. On `seq_ids`' device."""
    return seq_adv[gseq][seq_ids.cpu()].to(seq_ids.device)
