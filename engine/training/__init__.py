"""training/: the learner, one optimizer step of GRPO or PPO on a rank's groups, on FSDP2.

Owns: learner.py (the step, its state_dict), config.py (LearnerConfig; no torch), state.py (the
learner's state as full tensors), policy.py (the models, optimizer, LR schedule), batching.py
(token-budget micro-batches), prefix_attention.py (the rows layout's attention) and dist.py (process
group, FSDP2 wrapping, the loop's cross-rank agreement).
May import: rl/, kernels/, observe/, nothing above: checkpoints/io.py saves and loads a learner (the
stage driver calls it), and the loop's RolloutFailure is a record of rl/.
"""
