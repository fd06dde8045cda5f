"""The one route from rewards to advantages, for every stage kind (PPO aside: its advantages need the
critic's values, so the learner takes them from GAE, ppo.py).

Stages emit each response's reward and, where needed, its Credit (rl/records.py): the comparison
group, the unit the reward scored, the level and the level's weight. `advantages` reads them:
- no credit (call-level manager and answer RL, hints included): GRPO within the Group;
- "call", "global", "local" (episodes, rl/task/stages/episode.py): GRPO within the credit's group, over its
  units: responses that share a unit (the calls of one episode's session) count once, so a group's
  statistics are over the G episodes or re-rolls, not over their calls; then times the level's weight;
- "target" (warm starts, supervised controls, rejection sampling): the weight itself, uncompared.
Every group goes through one call of GRPO's kernel (grpo.py -> kernels/grpo_advantage.py).
"""
from __future__ import annotations

import torch

from memr1.rl.algos.config import GRPOConfig
from memr1.rl.algos.grpo import grpo_advantages
from memr1.rl.records import TrainBatch


def advantages(batch: TrainBatch, cfg: GRPOConfig) -> torch.Tensor:
    """One advantage per sequence of `batch`, in its order [N] (CPU, float32); see the module doc."""
    out = torch.zeros(batch.num_seqs, dtype=torch.float32)
    targets, weights = [], []       # supervised sequences and their advantages
    units: dict[tuple, list] = {}   # unit -> [order, reward, group, weight, its sequences]
    seq = 0
    for gi, g in enumerate(batch.groups):
        for j, reward in enumerate(g.rewards):
            c = g.credit[j] if g.credit is not None else None
            if c is not None and c.level == "target":
                targets.append(seq)
                weights.append(c.weight)
                seq += 1
                continue
            # Uncredited units come first, in batch order (as the learner ordered them before);
            # credited ones in their stage's unit order: the kernel pivots on a group's first member,
            # so this order keeps every advantage bit for bit what it was.
            key, order, group, w = ((("call", seq), (0, seq), ("call", gi), 1.0) if c is None else
                                    (("unit", c.unit), (1, c.unit), ("group", c.group), c.weight))
            u = units.get(key)
            if u is None:
                units[key] = [order, reward, group, w, [seq]]
            elif (u[1], u[2], u[3]) != (reward, group, w):
                raise ValueError(f"Group {g.source!r}: the responses of unit {c.unit} disagree on their "
                                 "reward, group or weight")
            else:
                u[4].append(seq)
            seq += 1
    if targets:
        out[targets] = torch.tensor(weights, dtype=torch.float32)
    if not units:
        return out
    ordered = sorted(units.values(), key=lambda u: u[0])
    ids: dict = {}
    group_ids = torch.tensor([ids.setdefault(u[2], len(ids)) for u in ordered])
    rewards = torch.tensor([u[1] for u in ordered], dtype=torch.float32)
    adv = grpo_advantages(rewards, group_ids, cfg, num_groups=len(ids)).cpu()
    # The weight multiplies in float64, then rounds once to float32, as the episode stage's Python
    # floats did before the learner read them.
    weighted = (adv.double() * torch.tensor([u[3] for u in ordered], dtype=torch.float64)).float()
    seqs = [s for u in ordered for s in u[4]]
    of_unit = [i for i, u in enumerate(ordered) for _ in u[4]]
    out[seqs] = weighted[of_unit]
    return out
