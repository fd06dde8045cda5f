"""What `memr1 rollout` writes: Parquet shards, the manifest and the summary.

DIR/manifest.json                      what ran (config, stage, split, items, world, each model's SHA-256),
                                       the models' paths, the commit, and the counts once finished
DIR/completions-s<step>-r<rank>.parquet   one row per completion of one step on one rank (COLUMNS)
DIR/prompts-s<step>-r<rank>.parquet       one row per group: its prompt's token ids, which rows reference
                                       by `prompt_key`
DIR/summary.json                       throughput, time per phase, rewards per op kind (rollout.py)

A step's shard is written to a temporary file, fsynced and renamed; the completions file is renamed
last, so its presence is what marks the step done (a rerun skips it) and a kill -9 loses at most the
step in flight. Parquet holds data only: reading a shard back executes nothing.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

MANIFEST_KIND = "memr1-rollouts"
OP = pa.struct([("event", pa.string()), ("id", pa.int64()), ("text", pa.string())])
# The fixed columns, in order; each reward part adds a float64 column "reward_<part>" after "reward".
COLUMNS = [
    ("step", pa.int32()), ("rank", pa.int16()), ("group", pa.int32()), ("index", pa.int16()),
    ("prompt_key", pa.string()),            # -> prompts-*.parquet's row of this group
    ("item", pa.string()), ("conversation", pa.string()), ("call_turns", pa.list_(pa.string())),
    ("level", pa.string()),                 # call | global | local (episode re-rolls)
    ("completion_ids", pa.list_(pa.int32())), ("completion_text", pa.string()),
    ("behav_logprobs", pa.list_(pa.float32())), ("completion_tokens", pa.int32()), ("truncated", pa.bool_()),
    ("status", pa.string()), ("invalid_ops", pa.int32()), ("applied", pa.bool_()),
    ("events", pa.list_(pa.string())), ("ops", pa.list_(OP)),
    ("reward", pa.float64()),
    ("advantage", pa.float64()),            # given by the stage (episodes); null: GRPO derives it in training
    ("answers", pa.list_(pa.string())), ("golds", pa.list_(pa.string())), ("scores", pa.list_(pa.float64())),
    ("bank_before", pa.int32()), ("bank_after", pa.int32()), ("weight_version", pa.int32()),
    # the step's seconds per phase (the same on each of its rows): prompts and retrieval, policy
    # generation, forks and op application, the frozen answerer, parsing and rewards
    ("t_prompt_s", pa.float64()), ("t_generate_s", pa.float64()), ("t_fork_apply_s", pa.float64()),
    ("t_frozen_s", pa.float64()), ("t_reward_s", pa.float64()), ("t_step_s", pa.float64()),
]
PROMPT_COLUMNS = [("prompt_key", pa.string()), ("step", pa.int32()), ("rank", pa.int16()), ("group", pa.int32()),
                  ("source", pa.string()), ("prompt_ids", pa.list_(pa.int32())), ("prompt_tokens", pa.int32())]


class RolloutDirError(ValueError):
    """The output folder cannot take this run (another config's rollouts, or not a rollout folder)."""


def shard_name(kind: str, step: int, rank: int) -> str:
    return f"{kind}-s{step:06d}-r{rank}.parquet"


def done(out: Path, step: int, rank: int) -> bool:
    return (out / shard_name("completions", step, rank)).is_file()


def step_phases(metrics: dict, step_s: float) -> dict[str, float]:
    """A step's seconds per phase from its metrics (rl/stages.py: gen_s includes prompt_s; score_s
    includes fork_s and frozen_s)."""
    prompt, gen = metrics.get("prompt_s", 0.0), metrics.get("gen_s", 0.0)
    fork, frozen = metrics.get("fork_s", 0.0), metrics.get("frozen_s", 0.0)
    return {"t_prompt_s": prompt, "t_generate_s": max(0.0, gen - prompt), "t_fork_apply_s": fork,
            "t_frozen_s": frozen, "t_reward_s": max(0.0, metrics.get("score_s", 0.0) - fork - frozen),
            "t_step_s": step_s}


def tables(rollout, step: int, rank: int, step_s: float) -> tuple[pa.Table, pa.Table]:
    """(completions, prompts) of one step's Rollout, one row per Sample and one per Group."""
    groups, samples = rollout.batch.groups, rollout.samples
    parts = sorted({p for g in groups for p in g.breakdown})
    phases = step_phases(rollout.metrics, step_s)
    key = [f"s{step}-r{rank}-g{i}" for i in range(len(groups))]
    rows = []
    for s in samples:
        g, j = groups[s.group], s.index
        rows.append({
            "step": step, "rank": rank, "group": s.group, "index": j, "prompt_key": key[s.group], "item": s.item,
            "conversation": s.conversation, "call_turns": s.call_turns, "level": s.level,
            "completion_ids": g.responses[j], "completion_text": s.text,
            "behav_logprobs": g.behav_logprobs[j] if g.behav_logprobs is not None else None,
            "completion_tokens": len(g.responses[j]), "truncated": bool(g.truncated[j]) if g.truncated else False,
            "status": s.status, "invalid_ops": s.invalid_ops, "applied": s.applied, "events": s.events, "ops": s.ops,
            "reward": g.rewards[j], **{f"reward_{p}": g.breakdown[p][j] if p in g.breakdown else None for p in parts},
            "advantage": g.advantages[j] if g.advantages is not None else None,
            "answers": s.answers, "golds": s.golds, "scores": s.scores, "bank_before": s.bank_before,
            "bank_after": s.bank_after, "weight_version": rollout.batch.weight_version, **phases})
    fields = COLUMNS[:COLUMNS.index(("reward", pa.float64())) + 1] + [(f"reward_{p}", pa.float64()) for p in parts] \
        + COLUMNS[COLUMNS.index(("reward", pa.float64())) + 1:]
    completions = pa.Table.from_pylist(rows, schema=pa.schema(fields))
    prompts = pa.Table.from_pylist(
        [{"prompt_key": key[i], "step": step, "rank": rank, "group": i, "source": g.source, "prompt_ids": g.prompt_ids,
          "prompt_tokens": len(g.prompt_ids)} for i, g in enumerate(groups)], schema=pa.schema(PROMPT_COLUMNS))
    return completions, prompts


def write_shard(out: Path, step: int, rank: int, rollout, step_s: float) -> int:
    """Write one step's shard atomically (prompts first, completions last); returns its rows."""
    completions, prompts = tables(rollout, step, rank, step_s)
    for kind, table in (("prompts", prompts), ("completions", completions)):
        final = out / shard_name(kind, step, rank)
        tmp = out / f".{final.name}.tmp"
        pq.write_table(table, tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    fd = os.open(out, os.O_RDONLY)
    try:
        os.fsync(fd)   # the renames themselves survive a crash
    finally:
        os.close(fd)
    return completions.num_rows


def read_completions(out: Path, columns: list[str] | None = None) -> pa.Table:
    """Every finished shard's completions, in (step, rank) order."""
    files = sorted(out.glob("completions-s*-r*.parquet"))
    if not files:
        raise RolloutDirError(f"{out}: no completions-*.parquet shard there")
    return pa.concat_tables([pq.read_table(f, columns=columns) for f in files], promote_options="default")


# ---- the manifest --------------------------------------------------------------------------------
def first_difference(a, b, path: str = "") -> str | None:
    """The first key path where two JSON values differ (None: equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}{k}"
            if (d := first_difference(a[k], b[k], f"{path}{k}.")) is not None:
                return d
        return None
    return None if a == b else path.rstrip(".") or "(root)"


def open_dir(out: Path, what: dict, commit: str | None, rank: int = 0, paths: dict | None = None) -> dict:
    """Create `out` with its manifest, or check that the one there describes the same rollouts (`what`;
    the commit and the models' `paths` are recorded, not compared); returns the manifest. This rank's
    leftover temporary files of a killed run are removed."""
    path = out / "manifest.json"
    what = json.loads(json.dumps(what))   # as it reads back (tuples become lists)
    if path.is_file():
        try:
            manifest = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise RolloutDirError(f"--out {out}: manifest.json is unreadable ({type(e).__name__}); use a new --out") \
                from None
        if not isinstance(manifest, dict) or manifest.get("kind") != MANIFEST_KIND:
            raise RolloutDirError(f"--out {out}: manifest.json is not a memr1 rollout manifest; use a new --out")
        if (key := first_difference(manifest.get("what"), what)) is not None:
            raise RolloutDirError(f"--out {out} holds rollouts of another setting ({key} differs); use a new --out "
                                  f"or the same command")
        for tmp in out.glob(f".*-r{rank}.parquet.tmp"):
            tmp.unlink()
        return manifest
    if out.exists() and any(out.iterdir()):
        raise RolloutDirError(f"--out {out}: a folder with files but no manifest.json; use an empty or new folder")
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"kind": MANIFEST_KIND, "version": 1, "what": what, "commit": commit, "paths": paths or {},
                "counts": None}
    write_json(path, manifest)
    return manifest


def write_json(path: Path, value) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
