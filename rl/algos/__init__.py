"""RL algorithms: how rewards become advantages (GRPO) or advantages plus value targets (PPO)."""
from memr1.rl.algos.grpo import GRPOConfig, dr_grpo, grpo_advantages
from memr1.rl.algos.ppo import Critic, PPOConfig, ppo_targets

__all__ = ["GRPOConfig", "dr_grpo", "grpo_advantages", "Critic", "PPOConfig", "ppo_targets"]
