"""Read the Chrome-trace JSON that profiling.py writes: the time in each named range (rl/spans.py)
and the top operators by self time (and, from a CUDA trace, the top kernels)."""
import json
from collections import defaultdict
from pathlib import Path

from memr1.rl.fileio import read_regular
from memr1.rl.spans import RANGES


def _complete(events: list[dict], cat: str) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and e.get("cat") == cat and "dur" in e]


def self_times(ops: list[dict]) -> list[float]:
    """Each op's duration minus its nested ops' (per thread; ops nest as intervals on one thread)."""
    self_us = [float(e["dur"]) for e in ops]
    by_thread = defaultdict(list)
    for i, e in enumerate(ops):
        by_thread[(e.get("pid"), e.get("tid"))].append(i)
    for idx in by_thread.values():
        idx.sort(key=lambda i: (ops[i]["ts"], -ops[i]["dur"]))
        stack: list[tuple[float, int]] = []   # (end, op) of the open ops
        for i in idx:
            start = ops[i]["ts"]
            while stack and stack[-1][0] <= start:
                stack.pop()
            if stack:
                self_us[stack[-1][1]] -= ops[i]["dur"]
            stack.append((start + ops[i]["dur"], i))
    return self_us


def _table(events: list[dict], times: list[float], top: int) -> list[dict]:
    agg: dict[str, list] = {}
    for e, t in zip(events, times):
        row = agg.setdefault(e["name"], [0, 0.0, 0.0])
        row[0] += 1
        row[1] += t
        row[2] += float(e["dur"])
    rows = sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]
    return [{"name": n, "count": c, "self_ms": s / 1e3, "total_ms": d / 1e3} for n, (c, s, d) in rows]


def summarize_trace(path: Path, top: int = 15) -> dict:
    """{"file", "window_ms", "ranges": [...], "top_ops": [...], "top_kernels": [...]} of one trace."""
    events = json.loads(read_regular(path, 1 << 30)).get("traceEvents", [])
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]
    window = (max(e["ts"] + e["dur"] for e in spans) - min(e["ts"] for e in spans)) / 1e3 if spans else 0.0
    ranges: dict[str, dict] = {}
    for cat, key in (("user_annotation", "cpu_ms"), ("gpu_user_annotation", "gpu_ms")):
        for e in _complete(events, cat):
            r = ranges.setdefault(e["name"], {"name": e["name"], "count": 0, "cpu_ms": 0.0, "gpu_ms": 0.0})
            r["count"] += cat == "user_annotation"
            r[key] += e["dur"] / 1e3
    order = {n: i for i, n in enumerate(RANGES)}
    named = sorted(ranges.values(), key=lambda r: (order.get(r["name"], len(order)), -r["cpu_ms"]))
    ops = _complete(events, "cpu_op")
    kernels = _complete(events, "kernel")
    return {"file": str(path), "window_ms": window, "ranges": named,
            "top_ops": _table(ops, self_times(ops), top),
            "top_kernels": _table(kernels, [float(k["dur"]) for k in kernels], top)}


def format_trace(summary: dict, top: int = 10) -> list[str]:
    """Markdown lines: the ranges, then the top operators (and kernels)."""
    lines = [f"window {summary['window_ms']:.1f} ms", "", "| range | count | CPU ms | GPU ms |", "|---|---:|---:|---:|"]
    lines += [f"| {r['name']} | {r['count']} | {r['cpu_ms']:.1f} | {r['gpu_ms']:.1f} |" for r in summary["ranges"]]
    for title, key in (("operator", "top_ops"), ("CUDA kernel", "top_kernels")):
        if summary[key]:
            lines += ["", f"| {title} (top by self time) | count | self ms | total ms |", "|---|---:|---:|---:|"]
            lines += [f"| `{r['name'][:80]}` | {r['count']} | {r['self_ms']:.2f} | {r['total_ms']:.2f} |"
                      for r in summary[key][:top]]
    return lines


def profile_section(cfg: dict, stages: dict, traces: list[Path], summary: dict, missing: list[str]) -> list[str]:
    """report.md's "Profiler traces" section; notes each configured step that left no trace in `missing`."""
    wanted = (cfg.get("profile") or {}).get("steps") or []
    for name, s in stages.items():
        last = max((r["step"] for r in s["rows"]), default=0)
        for n in wanted:
            if n <= last and not any(lo <= n <= hi for lo, hi in trace_spans(traces, name)):
                missing.append(f"profile: no trace of stage {name} step {n}")
    if not traces:
        return []
    lines = ["## Profiler traces", ""]
    for t in traces:
        try:
            s = summarize_trace(t)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:   # any file at all
            missing.append(f"profile/{t.parent.name}/{t.name}: unreadable ({type(e).__name__})")
            continue
        summary["profile"].append(s)
        lines += [f"### {t.parent.name}/{t.name}", "", *format_trace(s), ""]
    return lines


def trace_spans(traces: list[Path], stage: str) -> list[tuple[int, int]]:
    out = []
    for t in traces:
        parts = t.stem[5:].split("-")
        if t.parent.name == stage and all(p.isdigit() for p in parts):
            out.append((int(parts[0]), int(parts[-1])))
    return out
