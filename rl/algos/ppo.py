"""PPO: a critic predicts a value per response token, and GAE turns token rewards into advantages.

The critic is a separate model (same backbone architecture as the policy, its own weights) with a
scalar head, so the actor and critic can be sharded and stepped independently.
"""
from __future__ import annotations

from typing import Annotated

import msgspec
import torch
from msgspec import Meta
from torch import nn

from memr1 import kernels


class PPOConfig(msgspec.Struct, frozen=True, kw_only=True):
    gamma: Annotated[float, Meta(ge=0, le=1)] = 1.0
    lam: Annotated[float, Meta(ge=0, le=1)] = 1.0
    whiten: bool = True     # normalise advantages over the batch
    critic_lr: Annotated[float, Meta(gt=0)] = 1e-5
    critic_warmup: Annotated[int, Meta(ge=0)] = 0  # first steps train only the critic (the actor's update is skipped)


class Critic(nn.Module):
    """Transformer backbone + linear value head. `forward` returns one value per position."""

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)  # start as a constant predictor: no random early targets
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids, position_ids=None, **attention):
        """`attention`: what the backbone's attention needs besides ids (a mask, or a layout)."""
        hidden = self.backbone(input_ids=input_ids, position_ids=position_ids, use_cache=False,
                               **attention).last_hidden_state
        return self.value_head(hidden.float()).squeeze(-1)


def ppo_targets(seq_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, cfg: PPOConfig,
                kl: torch.Tensor | None = None, kl_coef: float = 0.0):
    """Advantages and returns [N, T] for padded response tokens.

    seq_rewards [N] lands on each sequence's last response token; values [N, T] are the critic's
    estimates before each token (the bootstrap after the last token is 0: episodes end there);
    kl [N, T] (optional) is subtracted per token as a reward penalty.
    """
    n, t = mask.shape
    if values.shape != (n, t) or seq_rewards.shape != (n,):
        raise ValueError(f"values {tuple(values.shape)} must be [N, T]={n, t} and seq_rewards [N]")
    fmask = mask.to(torch.float32)
    last = (fmask.cumsum(1) == fmask.sum(1, keepdim=True)) & mask.bool()  # the last trained token
    token_rewards = last.float() * seq_rewards.float()[:, None]
    if kl is not None and kl_coef:
        token_rewards = token_rewards - kl_coef * kl.float() * fmask
    values_ext = torch.cat([values.float() * fmask, values.new_zeros(n, 1, dtype=torch.float32)], 1)
    return kernels.gae(token_rewards, values_ext, fmask, cfg.gamma, cfg.lam, whiten=cfg.whiten)
