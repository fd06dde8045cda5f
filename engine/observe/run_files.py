"""What `memr1 report` reads from a run folder, read defensively: a run killed mid-write leaves torn
lines, and the folder may hold anything at all. Each reader returns only well-formed values and notes
what it passed over in `missing`, so the report shows what reads and names the rest. Only regular files
are read (rl/fileio.read_regular): a FIFO or a device where a file was expected is passed over too."""
import json
import math
import tomllib
from pathlib import Path
from typing import Annotated

import msgspec

from memr1.rl.fileio import read_regular

MAX_VALUE = 1e15   # a logged number beyond this is garbage: sums of them overflow the plots
MAX_STEP = 10**9
LIMIT = 1 << 30   # bytes read of any one file: a run's files are far smaller


def read_json(path: Path):
    """(value, None), or (None, why) when the file does not read as JSON."""
    try:
        return json.loads(read_regular(path, LIMIT)), None
    except (OSError, ValueError, RecursionError) as e:   # not a file, not UTF-8, not JSON, nested too deep
        return None, type(e).__name__


def _at(raw, parts: tuple):
    for p in parts:
        if not isinstance(raw, dict) or p not in raw:
            return None
        raw = raw[p]
    return raw


def read_config(run_dir: Path, missing: list[str]) -> dict:
    """The keys of config.toml the report uses, each only when it has its type."""
    path = run_dir / "config.toml"
    if not path.is_file():
        return {}
    try:
        raw = tomllib.loads(read_regular(path, LIMIT).decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:   # not a file, not TOML, not UTF-8, a 5,000-digit integer
        missing.append(f"config.toml: unreadable ({type(e).__name__}), so the configured stages are unknown")
        return {}
    keys = {("stages",): list[str], ("eval_split",): str, ("eval_after",): list[str], ("learner", "device"): str,
            ("loop", "max_staleness"): int, ("eval", "resamples"): Annotated[int, msgspec.Meta(ge=1)], ("profile", "steps"): list[int]}
    stages = _at(raw, ("stages",))
    keys.update({("stage", s, "steps"): int for s in stages if isinstance(s, str)} if isinstance(stages, list) else {})
    cfg, bad = {}, []
    for parts, typ in keys.items():
        value = _at(raw, parts)
        if value is None:
            continue
        try:
            value = msgspec.convert(value, typ)
        except msgspec.ValidationError:
            bad.append(".".join(parts))
            continue
        node = cfg
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    if bad:
        missing.append(f"config.toml: {', '.join(bad)} of the wrong type, left out")
    return cfg


def _number_ok(v) -> bool:
    return not isinstance(v, (int, float)) or isinstance(v, bool) or math.isnan(v) or abs(v) <= MAX_VALUE


def read_metrics(run_dir: Path, missing: list[str]) -> list[dict]:
    """The rows of metrics.jsonl with a stage name and a step number."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        missing.append("metrics.jsonl: none, so no training step was logged")
        return []
    try:
        lines = read_regular(path, LIMIT).splitlines()
    except (OSError, ValueError) as e:
        missing.append(f"metrics.jsonl: unreadable ({type(e).__name__}), so no training step is shown")
        return []
    rows, bad, odd, huge = [], 0, 0, 0
    for line in lines:
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):   # torn by a kill, not UTF-8, nested too deep
            bad += 1
            continue
        if not isinstance(row, dict) or "stage" not in row or "step" not in row:
            continue
        step = row["step"]
        if not isinstance(row["stage"], str) or type(step) is not int or not 0 <= step <= MAX_STEP:
            odd += 1
            continue
        kept = {k: v for k, v in row.items() if _number_ok(v)}
        huge += len(row) - len(kept)
        rows.append(kept)
    if bad:
        missing.append(f"metrics.jsonl: {bad} unreadable line(s) skipped (a run killed while writing)")
    if odd:
        missing.append(f"metrics.jsonl: {odd} line(s) without a stage name and a step number skipped")
    if huge:
        missing.append(f"metrics.jsonl: {huge} value(s) beyond {MAX_VALUE:g} left out")
    return rows


class _Answer(msgspec.Struct):
    sample_id: str
    question: str
    category: int
    f1: float
    em: float


class _Metric(msgspec.Struct):
    f1: float | None = None
    em: float | None = None
    bleu1: float | None = None
    j: float | None = None
    n: int | None = None


class _Latency(msgspec.Struct):
    samples_s: list[float] | None = None
    p50_s: float | None = None
    p95_s: float | None = None


class _Eval(msgspec.Struct):
    answers: list[_Answer]
    metrics: dict[str, _Metric]
    latency: dict[str, _Latency | None] | None = None


class _Interval(msgspec.Struct):
    delta: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None


def read_evals(run_dir: Path, missing: list[str]) -> dict[str, dict]:
    """"<split>[.<label>]" -> the eval report, for every eval/*.json of an eval report's shape."""
    out = {}
    for path in sorted((run_dir / "eval").glob("*.json")):
        if path.name == "summary.json":
            continue
        report, why = read_json(path)
        if why is None and isinstance(report, dict) and "answers" in report and "metrics" in report:
            try:
                msgspec.convert(report, _Eval)
                out[path.stem] = report
            except msgspec.ValidationError as e:
                missing.append(f"eval/{path.name}: not an eval report ({e})")
        elif why is not None:
            missing.append(f"eval/{path.name}: unreadable (a run killed while writing it?)")
    return out


def read_comparisons(run_dir: Path, missing: list[str]) -> dict:
    """eval/summary.json's paired comparisons: "b - a" -> metric -> {delta, ci_low, ci_high}."""
    path = run_dir / "eval" / "summary.json"
    if not path.is_file():
        return {}
    summary, why = read_json(path)
    try:
        comparisons = summary.get("comparisons", {}) if why is None and isinstance(summary, dict) else None
        msgspec.convert(comparisons, dict[str, dict[str, _Interval]])
        return comparisons
    except msgspec.ValidationError:
        missing.append("eval/summary.json: unreadable, so the paired intervals are the report's own")
        return {}
