"""engine/: the top layer, which runs the task of rl/ as training and evaluation.

Here, top down: the commands (cli.py hands `memr1 <cmd>` by name to train.py, evaluate.py, rollout.py
and rollout_report.py; none imports another); what they share: assembly.py (a run's RunContext:
engines, embedder, items, judge; the stage constructors; the checkpoints the flags name),
stage_driver.py (one stage's training), eval_split.py (one split evaluated), compare.py (train's final
evaluation), rollout_files.py and rollout_summary.py (a rollout folder); below them the items a run
trains on (items.py), validation.py, the async actor-learner loop (loop.py), and preload.py (process
set-up before anything loads). Folders, bottom up; each may import rl/, kernels/, memory_store/ and the
folders before it here, and the files above may import them all:
  observe/      logs, metrics, reports, figures, profiler traces, the quiet terminal
  generation/   the engines that sample completions, their weight updates and weight swapping
  training/     the learner: FSDP2 models, micro-batches, prefix attention, its state
  config/       the run config, its resolution and plan, the cache keys and judge train and eval share
  checkpoints/  checkpoint folders, their manifests, and what a resume checks
Each folder's config module (generation/config.py, training/config.py, checkpoints/files.py,
observe/profiling.py) imports no torch and nothing else of engine, so config/run.py composes them all.
No __init__ re-exports anything heavy: importing a config module never loads torch.
"""
