"""A rollout folder's numbers: summary.json, written by `memr1 rollout` at its end from every finished
shard, and read by `memr1 report DIR` (rollout_report.py):
  counts       rows (completions), groups, steps, shards, items, conversations
  reward       mean and variance over completions, the mean of each reward part, and per op kind
               (ADD / UPDATE / DELETE / NONE: the completions whose ops include one; parse_error:
               those with no parsable reply) n, mean and variance; zero_variance_groups: the share of
               groups of two or more completions whose rewards are all equal (no GRPO signal)
  ops          each event's count per completion, and each status's share
  bank         mean memories before and after a completion's ops
  phases       seconds per phase summed over the shards' steps, and each one's share of them
  throughput   this invocation's rates over its own wall time of steps and writes (skipped shards
               excluded): rollouts/s, generated tokens/s, forks/s, bank ops/s; its set-up and write
               seconds. A rerun that found every shard done keeps the previous throughput.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from memr1.engine.rollout_files import RolloutDirError, read_completions, read_manifest, write_json
from memr1.rl.fileio import read_regular

EVENTS = ("ADD", "UPDATE", "DELETE", "NONE")
PHASES = ("t_prompt_s", "t_generate_s", "t_fork_apply_s", "t_frozen_s", "t_reward_s")
READ = ["step", "rank", "prompt_key", "item", "conversation", "status", "events", "reward", "completion_tokens",
        "bank_before", "bank_after", *PHASES, "t_step_s"]


def moments(values: list[float]) -> dict:
    n = len(values)
    if not n:
        return {"n": 0, "mean": None, "var": None}
    m = sum(values) / n
    return {"n": n, "mean": m, "var": sum((v - m) ** 2 for v in values) / n}


def summarize(out: Path, totals: dict | None = None, write: bool = True) -> dict:
    """summary.json of a rollout folder (module doc), written there (and the manifest's counts) when
    `write`; `totals`: this invocation's counts and seconds."""
    table = read_completions(out)
    parts = [c for c in table.column_names if c.startswith("reward_")]
    rows = table.select([c for c in READ if c in table.column_names] + parts).to_pylist()
    rewards = [r["reward"] for r in rows]
    by_kind: dict[str, list[float]] = defaultdict(list)
    groups: dict[str, list[float]] = defaultdict(list)
    events, status = Counter(), Counter()
    for r in rows:
        groups[r["prompt_key"]].append(r["reward"])
        status[r["status"]] += 1
        for e in set(r["events"] or []):
            by_kind[e].append(r["reward"])
        events.update(r["events"] or [])
        if r["status"] == "parse_error":
            by_kind["parse_error"].append(r["reward"])
    steps = {(r["step"], r["rank"]): r for r in rows}   # a step's timings repeat on each of its rows
    seconds = {p[2:-2]: sum(s[p] for s in steps.values()) for p in PHASES}
    step_s = sum(s["t_step_s"] for s in steps.values())
    seconds["other"] = max(0.0, step_s - sum(seconds.values()))
    multi = [g for g in groups.values() if len(g) > 1]
    n = len(rows)
    summary = {
        "counts": {"rows": n, "groups": len(groups), "steps": len({s for s, _ in steps}), "shards": len(steps),
                   "items": len({r["item"] for r in rows}), "conversations": len({r["conversation"] for r in rows})},
        "reward": {**moments(rewards), "parts": {p[7:]: moments([r[p] for r in rows if r[p] is not None])["mean"]
                                                 for p in parts},
                   "by_op": {k: moments(by_kind[k]) for k in (*EVENTS, "parse_error")},
                   "zero_variance_groups": sum(max(g) == min(g) for g in multi) / len(multi) if multi else None},
        "ops": {"per_completion": {e: events[e] / n for e in EVENTS}, "status": {k: v / n for k, v in status.items()}},
        "bank": {"before": moments([r["bank_before"] for r in rows])["mean"],
                 "after": moments([r["bank_after"] for r in rows])["mean"]},
        "phases": {"seconds": seconds, "share": {k: v / step_s if step_s else None for k, v in seconds.items()}},
        "throughput": throughput(totals, out),
    }
    if write:
        manifest = read_manifest(out)
        try:
            write_json(out / "summary.json", summary)
            write_json(out / "manifest.json", {**manifest, "counts": summary["counts"]})
        except OSError as e:
            raise RolloutDirError(f"{out}: cannot write the summary there ({e.strerror or e})") from None
    return summary


def throughput(totals: dict | None, out: Path) -> dict:
    if not totals or not totals.get("steps"):   # the previous run's, when it is a dict of numbers
        try:
            kept = json.loads(read_regular(out / "summary.json", 64 << 20))["throughput"]
        except (OSError, ValueError, KeyError, TypeError, IndexError, RecursionError):
            return {}
        if not isinstance(kept, dict):
            return {}
        return {k: v for k, v in kept.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    wall = totals["step_s"] + totals["write_s"]
    return {"rollouts_per_s": totals["rows"] / wall, "generated_tokens_per_s": totals["response_tokens"] / wall,
            "forks_per_s": totals["forks"] / wall, "bank_ops_per_s": totals["bank_ops"] / wall,
            "steps": totals["steps"], "skipped_steps": totals["skipped"], "rows": totals["rows"],
            "wall_s": wall, "write_s": totals["write_s"], "setup_s": totals["setup_s"],
            "write_share": totals["write_s"] / wall}
