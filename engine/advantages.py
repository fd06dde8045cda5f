"""Advantages for a rank's batch: GRPO's per group (or the group's own, for scripted replies), and
PPO's per token from the critic and GAE, whitened with moments summed over the ranks (scalars only)."""
from __future__ import annotations

import math

import msgspec
import torch

from memr1.engine.batching import Micro
from memr1.rl.algos import GRPOConfig, grpo_advantages, ppo_targets
from memr1.rl.losses import kl_penalty
from memr1.rl.records import TrainBatch


def group_advantages(batch: TrainBatch, cfg: GRPOConfig) -> torch.Tensor:
    """One advantage per sequence: given by the group, or GRPO's within-group normalisation."""
    rewards = torch.tensor([r for g in batch.groups for r in g.rewards], dtype=torch.float32)
    if not rewards.numel():
        return rewards
    group_ids = torch.tensor([i for i, g in enumerate(batch.groups) for _ in g.responses])
    adv = grpo_advantages(rewards, group_ids, cfg, num_groups=len(batch.groups)).float().cpu()
    start = 0
    for g in batch.groups:
        if g.advantages is not None:
            adv[start:start + len(g)] = torch.tensor(g.advantages, dtype=torch.float32)
        start += len(g)
    return adv


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


@torch.no_grad()
def ppo_token_targets(learner, batch: TrainBatch, micros: list[Micro]) -> None:
    """Critic values and (optionally) KL penalties for every local token, GAE per sequence, then
    advantages whitened with moments summed over all ranks; set on each micro-batch."""
    cfg, d = learner.cfg, learner.d
    kl_coef = cfg.loss.kl_coef if cfg.loss.kl_in_reward else 0.0
    for m in micros:
        with learner.compute():
            m.old_values = learner.critic(**m.model_inputs()).reshape(-1)[m.index].float()
            if kl_coef:
                m.kl = kl_penalty(learner.policy(m), learner.ref(m), cfg.loss.kl_estimator)
    real = [m for m in micros if not m.dummy]
    flat_adv = flat_ret = torch.zeros(0, device=d.device)
    if real:
        rewards = torch.tensor([r for g in batch.groups for r in g.rewards], dtype=torch.float32)
        offsets = torch.tensor([0] + [m.num_seqs for m in real]).cumsum(0)
        seqs = torch.cat([m.seq_ids + off for m, off in zip(real, offsets.tolist())])
        pos = torch.cat([m.pos_in_seq for m in real])
        gseq = torch.cat([m.gseq for m in real])
        grid = lambda flat: torch.zeros(len(gseq), int(pos.max()) + 1, device=flat.device).index_put_(
            (seqs, pos), flat.float())
        values = grid(torch.cat([m.old_values for m in real]))
        mask = grid(torch.ones_like(pos, dtype=torch.float32)).bool()
        kl = grid(torch.cat([m.kl for m in real])) if kl_coef else None
        adv, ret = ppo_targets(rewards[gseq].to(values.device), values, mask,
                               msgspec.structs.replace(cfg.ppo, whiten=False), kl, kl_coef)
        flat_adv, flat_ret = adv[seqs, pos], ret[seqs, pos]
    if cfg.ppo.whiten:
        s, sq, n = d.all_reduce_sum(torch.stack([flat_adv.sum(), flat_adv.square().sum(),
                                                 torch.tensor(float(flat_adv.numel()), device=d.device)])).tolist()
        mean = s / max(n, 1.0)
        var = (sq - n * mean * mean) / max(n - 1.0, 1.0)
        flat_adv = (flat_adv - mean) / math.sqrt(max(var, 0.0) + 1e-8)
    start = 0
    for m in micros:
        size = 0 if m.dummy else m.index.numel()
        m.advantages = flat_adv[start:start + size] if size else torch.zeros_like(m.old_values)
        m.returns = flat_ret[start:start + size] if size else torch.zeros_like(m.old_values)
        start += size
