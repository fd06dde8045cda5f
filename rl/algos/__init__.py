"""RL algorithms: how rewards become advantages (GRPO) or advantages plus value targets (PPO)."""
from memr1.rl.algos.grpo import (GRPOConfig, dr_grpo, drop_zero_advantage_groups, group_advantages, grpo_advantages,
                                 token_advantages)
from memr1.rl.algos.ppo import Critic, PPOConfig, ppo_targets, ppo_token_targets

__all__ = ["GRPOConfig", "dr_grpo", "drop_zero_advantage_groups", "group_advantages", "grpo_advantages",
           "token_advantages", "Critic", "PPOConfig", "ppo_targets", "ppo_token_targets"]
