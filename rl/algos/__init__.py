"""RL algorithms: how rewards become advantages (GRPO, grpo.py) or advantages plus value targets (PPO,
ppo.py); their settings and the loss's are config.py, which imports no torch. Import the modules
themselves: this file re-exports nothing, so reading a config never loads torch through it."""
