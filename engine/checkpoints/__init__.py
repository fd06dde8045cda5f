"""checkpoints/: a stage's `checkpoints/step_<N>/` folders and what a resume checks.

Owns: io.py (save and load through the learner's state_dict; the checkpoint a stage hands on),
files.py (manifests, verification, pruning, CheckpointConfig; no torch) and resume.py (config changes
a resume may make, the checkpoint each stage resumes from, metrics cut back to it).
May import: rl/, observe/, config/ (stage names, the run config).
"""
