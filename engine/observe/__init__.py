"""observe/: what a run shows and leaves behind.

Owns: runlog.py (metrics.jsonl, TensorBoard, the progress bar), report.py and figures.py (`memr1
report`), traces.py and profiling.py (torch.profiler traces of chosen steps), throughput.py (rates,
MFU, native bf16) and quiet.py (the quiet terminal: library noise to RUN_DIR/run.log).
May import: rl/ only (torch only inside functions, so profiling.py's ProfileConfig stays torch-free).
"""
