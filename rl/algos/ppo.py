"""PPO: a critic predicts a value per response token, and GAE turns token rewards into advantages.

The critic is a separate model (same backbone architecture as the policy, its own weights) with a
scalar head, so the actor and critic can be sharded and stepped independently.

`ppo_token_targets` turns a rank's critic values (and KL penalties) per micro-batch into advantages
and returns per token, whitened with moments summed over the ranks (scalars only cross them).
"""
from __future__ import annotations

import math
from typing import Callable, Protocol, Sequence

import msgspec
import torch
from torch import nn

from memr1 import kernels
from memr1.rl.algos.config import PPOConfig


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


class TokenIndex(Protocol):
    """Where a micro-batch's trained tokens sit in the rank's batch (engine/training/batching.py's Micro
    is one)."""
    seq_ids: torch.Tensor   # [M] each token's sequence, local to the micro-batch
    pos_in_seq: torch.Tensor  # [M] each token's position within its response
    gseq: torch.Tensor      # [S] each local sequence's index in the rank's batch
    num_seqs: int           # S
    dummy: bool             # a placeholder with no real tokens (it keeps collectives in step)


@torch.no_grad()
def ppo_token_targets(seq_rewards: torch.Tensor, micros: Sequence[TokenIndex], values: Sequence[torch.Tensor],
                      cfg: PPOConfig, all_reduce_sum: Callable[[torch.Tensor], torch.Tensor],
                      kls: Sequence[torch.Tensor] | None = None, kl_coef: float = 0.0
                      ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(advantages, returns) [M] for each micro-batch: GAE per sequence of the rank's batch, then (with
    `cfg.whiten`) advantages whitened with moments summed by `all_reduce_sum`, which every rank calls.

    seq_rewards [N]: each sequence's reward; values[i] [M_i]: the critic's value per token of micros[i];
    kls[i] [M_i] (with `kl_coef`): per-token KL penalties subtracted from the reward."""
    device = values[0].device
    real = [i for i, m in enumerate(micros) if not m.dummy]
    flat_adv = flat_ret = torch.zeros(0, device=device)
    if real:
        offsets = torch.tensor([0] + [micros[i].num_seqs for i in real]).cumsum(0)
        seqs = torch.cat([micros[i].seq_ids + off for i, off in zip(real, offsets.tolist())])
        pos = torch.cat([micros[i].pos_in_seq for i in real])
        gseq = torch.cat([micros[i].gseq for i in real])
        grid = lambda flat: torch.zeros(len(gseq), int(pos.max()) + 1, device=flat.device).index_put_(
            (seqs, pos), flat.float())
        value_grid = grid(torch.cat([values[i] for i in real]))
        mask = grid(torch.ones_like(pos, dtype=torch.float32)).bool()
        kl = grid(torch.cat([kls[i] for i in real])) if kl_coef else None
        adv, ret = ppo_targets(seq_rewards[gseq].to(value_grid.device), value_grid, mask,
                               msgspec.structs.replace(cfg, whiten=False), kl, kl_coef)
        flat_adv, flat_ret = adv[seqs, pos], ret[seqs, pos]
    if cfg.whiten:
        s, sq, n = all_reduce_sum(torch.stack([flat_adv.sum(), flat_adv.square().sum(),
                                               torch.tensor(float(flat_adv.numel()), device=device)])).tolist()
        mean = s / max(n, 1.0)
        var = (sq - n * mean * mean) / max(n - 1.0, 1.0)
        flat_adv = (flat_adv - mean) / math.sqrt(max(var, 0.0) + 1e-8)
    out, start = [], 0
    for m, v in zip(micros, values):
        size = 0 if m.dummy else m.seq_ids.numel()
        out.append((flat_adv[start:start + size], flat_ret[start:start + size]) if size
                   else (torch.zeros_like(v), torch.zeros_like(v)))
        start += size
    return out
