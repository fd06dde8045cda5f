"""The Memory-R1 stages as the loop sees them: a step number in, a scored rollout of groups out."""
