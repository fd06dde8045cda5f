"""One learner step under torch.profiler, for bench.gpu_learner: the top ops by time, and the Chrome trace
gzipped to a size that the device tool returns (TRACE_LIMIT), dropping the shortest host events when the
whole trace does not fit."""
from __future__ import annotations

import gzip
import json
import shutil
import tempfile
from pathlib import Path

import torch

TRACE_LIMIT = 15 << 20  # what one returned file may hold, with some margin under 16 MiB


def sync(device: torch.device) -> None:
    """Waits for the device's queued work, so that a wall-clock timer around a step measures the step."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_step(learner, batch, device: torch.device, out: Path) -> dict:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profile(activities=acts, record_shapes=False, with_stack=False) as prof:
        learner.train_step(batch)
        sync(device)
    tmp = Path(tempfile.mkdtemp(prefix="memr1-trace-"))
    try:
        raw = tmp / "trace.json"
        prof.export_chrome_trace(str(raw))
        raw_bytes = raw.stat().st_size
        trace = out / "learner_trace.json.gz"
        trimmed = write_trace(raw, trace)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cuda = device.type == "cuda"
    events = prof.key_averages()
    top = {}
    for key in (("device_time_total", "self_device_time_total") if cuda else ("cpu_time_total", "self_cpu_time_total")):
        ranked = sorted(events, key=lambda e: _time(e, key), reverse=True)[:15]
        top[key] = [{"op": e.key, "count": e.count, "cuda_total_us": _time(e, "device_time_total"),
                     "cuda_self_us": _time(e, "self_device_time_total"), "cpu_total_us": _time(e, "cpu_time_total"),
                     "cpu_self_us": _time(e, "self_cpu_time_total")} for e in ranked]
    sort = "cuda_time_total" if cuda else "cpu_time_total"
    print(f"\ntop 15 ops of one learner step by {sort}:")
    print(events.table(sort_by=sort, row_limit=15, max_name_column_width=60))
    if cuda:
        print("top 15 ops by self CUDA time (the kernels' own time):")
        print(events.table(sort_by="self_cuda_time_total", row_limit=15, max_name_column_width=60))
    info = {"trace": trace.name, "trace_raw_bytes": raw_bytes, "trace_gz_bytes": trace.stat().st_size,
            "trace_trimmed_below_us": trimmed, "activities": [a.name for a in acts], "top_ops": top}
    print(f"wrote {trace} ({raw_bytes / 2**20:.1f} MiB raw, {info['trace_gz_bytes'] / 2**20:.2f} MiB gzipped"
          + (f", events under {trimmed} us dropped" if trimmed else "") + ")", flush=True)
    return info


def _time(e, key: str) -> float:
    v = getattr(e, key, None)
    if v is None:
        v = getattr(e, key.replace("device", "cuda"), 0.0)
    return float(v or 0.0)


def write_trace(raw: Path, dest: Path) -> float:
    """gzip the Chrome trace into `dest`. If that is over TRACE_LIMIT, drop the flow arrows and the host
    events (CPU ops, CUDA runtime calls) shorter than a threshold, doubling it until the file fits; GPU
    events (kernels, copies) go only once the threshold passes 1 ms. Returns the threshold in us (0:
    nothing dropped)."""
    with open(raw, "rb") as src, gzip.open(dest, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst)
    if dest.stat().st_size <= TRACE_LIMIT:
        return 0.0
    trace = json.loads(raw.read_text())
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") not in ("s", "f", "t")]
    gpu = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
    threshold = 2.0
    while True:
        trace["traceEvents"] = [e for e in events if e.get("ph") != "X" or float(e.get("dur", 0)) >= threshold
                                or (e.get("cat") in gpu and threshold <= 1000)]
        with gzip.open(dest, "wt", compresslevel=6) as dst:
            json.dump(trace, dst)
        if dest.stat().st_size <= TRACE_LIMIT or threshold > 1e9:
            return threshold
        threshold *= 2
