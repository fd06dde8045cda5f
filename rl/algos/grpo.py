"""GRPO: advantages are rewards normalised within each group of completions of one prompt.

The std convention is explicit because peers differ silently (verl: unbiased, torchtitan: population,
Dr.GRPO: none). Dr.GRPO also needs a length-independent aggregation, see `dr_grpo`.
"""
from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta
import torch

from memr1 import kernels
from memr1.rl.losses import LossConfig


class GRPOConfig(msgspec.Struct, frozen=True, kw_only=True):
    std: Literal["unbiased", "population", "none"] = "unbiased"
    baseline: Literal["mean", "loo"] = "mean"
    eps: Annotated[float, Meta(gt=0)] = 1e-6

    def __post_init__(self):
        if self.std not in ("unbiased", "population", "none"):
            raise ValueError(f"GRPOConfig.std={self.std!r}; expected unbiased, population or none")
        if self.baseline not in ("mean", "loo"):
            raise ValueError(f"GRPOConfig.baseline={self.baseline!r}; expected mean or loo")


def dr_grpo(horizon: int, loss: LossConfig | None = None) -> tuple[GRPOConfig, LossConfig]:
    """Dr.GRPO (Liu et al. 2025): no std scaling and a constant-length token sum, so neither the
    question's difficulty nor the answer's length reweights the gradient."""
    loss = loss or LossConfig()
    return GRPOConfig(std="none"), msgspec.structs.replace(loss, aggregation="seq-mean-token-sum-norm",
                                                           horizon=horizon)


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
