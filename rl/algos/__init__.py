"""RL algorithms: how rewards become advantages (advantages.py, the one route for every stage kind, on
GRPO's grpo.py) or advantages plus value targets (PPO, ppo.py), the losses (losses.py), rejection
sampling (rejection.py); their settings and the loss's are config.py, which imports no torch. Import the modules
themselves: this file re-exports nothing, so reading a config never loads torch through it."""
