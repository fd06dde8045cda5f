"""engine/: the top layer, which runs the task of rl/ as training and evaluation.

Here: the commands (cli.py hands `memr1 <cmd>` to train.py, evaluate.py, compare.py, ...), the items
a run trains on (items.py), the async actor-learner loop (loop.py), and preload.py (process set-up
before anything loads). Folders, bottom up; each may import rl/, kernels/, memory_store/ and the
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
