"""What `memr1 rollout` writes: Parquet shards, the manifest and the summary.

DIR/manifest.json                      what ran (config, stage, split, items, world, each model's SHA-256),
                                       the models' paths, the commit, and the counts once finished
DIR/completions-s<step>-r<rank>.parquet   one row per completion of one step on one rank (COLUMNS)
DIR/prompts-s<step>-r<rank>.parquet       one row per group: its prompt's token ids, which rows reference
                                       by `prompt_key`
DIR/summary.json                       throughput, time per phase, rewards per op kind (rollout.py)

DIR/shards-r<rank>.json                each rank's shard manifest: the rows of every shard it wrote

Every file is written whole or not at all by rl/fileio.write_atomic (a new file created exclusively,
then renamed: nothing planted in DIR, a symlink included, is written through). A step writes its
prompts, then records both shards' rows, then its completions: a rerun skips a step only when both
shards are recorded, their Parquet footers read and hold the recorded rows, so a kill -9 loses at most
the step in flight, and a truncated or replaced shard is rolled out again. Whatever DIR holds is read
as data only: no FIFO or device is opened, Parquet executes nothing, and a shard of the wrong shape
or a JSON file of the wrong type is a RolloutDirError (one line), never a traceback.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from memr1.rl.fileio import is_temporary, open_regular, read_regular, write_atomic

MANIFEST_KIND = "memr1-rollouts"
OP = pa.struct([("event", pa.string()), ("id", pa.int64()), ("text", pa.string())])
# a parsed UPDATE, DELETE or NONE: the shown id it gives and the memory text it copies
REF = pa.struct([("event", pa.string()), ("local_id", pa.int32()), ("old_memory", pa.string())])
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
    # manager calls: each parsed op's reference, and the memories the prompt showed (local id = position)
    ("refs", pa.list_(REF)), ("shown_ids", pa.list_(pa.int64())), ("shown_texts", pa.list_(pa.string())),
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


def ledger_name(rank: int) -> str:
    return f"shards-r{rank}.json"


def recorded(out: Path, rank: int) -> dict[str, int]:
    """This rank's shard manifest: shard name -> rows ({} when missing or not of its shape, so every
    shard is rolled out again rather than trusted)."""
    try:
        value = json.loads(read_regular(out / ledger_name(rank), 16 << 20))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and type(v) is int and v >= 0}


def parquet_rows(path: Path) -> int:
    """The rows its footer records; OSError, ArrowException or ValueError when it does not read."""
    with open_regular(path) as f:
        return pq.ParquetFile(f).metadata.num_rows


def done(out: Path, step: int, rank: int, ledger: dict[str, int] | None = None) -> bool:
    """Whether the step's two shards are whole: recorded, their footers read, with the recorded rows."""
    ledger = recorded(out, rank) if ledger is None else ledger
    for kind in ("prompts", "completions"):
        name = shard_name(kind, step, rank)
        try:
            if name not in ledger or parquet_rows(out / name) != ledger[name]:
                return False
        except (OSError, ValueError, pa.ArrowException):
            return False
    return True


def step_phases(metrics: dict, step_s: float) -> dict[str, float]:
    """A step's seconds per phase from its metrics (rl/task/stages/calls.py: gen_s includes prompt_s; score_s
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
            "refs": s.refs, "shown_ids": s.shown_ids, "shown_texts": s.shown_texts,
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
    """Write one step's shard (module doc: prompts, the record of both, completions); returns its rows."""
    completions, prompts = tables(rollout, step, rank, step_s)
    write_atomic(out / shard_name("prompts", step, rank), lambda f: pq.write_table(prompts, f))
    ledger = recorded(out, rank)
    ledger.update({shard_name("prompts", step, rank): prompts.num_rows,
                   shard_name("completions", step, rank): completions.num_rows})
    write_atomic(out / ledger_name(rank), json.dumps(ledger, sort_keys=True))
    write_atomic(out / shard_name("completions", step, rank), lambda f: pq.write_table(completions, f))
    return completions.num_rows


# What the report reads of each shard, with the type the writer gives it (COLUMNS); every other column
# of COLUMNS must have its own type too, so the shards concatenate.
TYPES = dict(COLUMNS)
NULLABLE = {"events", "behav_logprobs", "advantage", "ops", "call_turns", "answers", "golds", "scores", "refs",
            "shown_ids", "shown_texts"}
LATER = {"refs", "shown_ids", "shown_texts"}   # columns shards written before them lack: read as absent


def shard_problem(table: pa.Table) -> str | None:
    """What makes a completions table unusable for the summary, or None."""
    for name in table.column_names:
        want = TYPES.get(name, pa.float64() if name.startswith("reward_") else None)
        if want is not None and table.schema.field(name).type != want:
            return f"column {name} is {table.schema.field(name).type}, not {want}"
    if missing := [n for n, _ in COLUMNS if n not in table.column_names and n not in LATER]:
        return f"no column {missing[0]}"
    if nulls := [n for n, _ in COLUMNS if n not in NULLABLE and n in table.column_names and table.column(n).null_count]:
        return f"null {nulls[0]} in {table.column(nulls[0]).null_count} row(s)"
    for name in ("reward", "t_prompt_s", "t_generate_s", "t_fork_apply_s", "t_frozen_s", "t_reward_s", "t_step_s"):
        if len(table) and not pc.all(pc.is_finite(table.column(name))).as_py():   # the figures' axes need finite values
            return f"a {name} that is not a finite number"
    return None


def read_shard(path: Path) -> pa.Table:
    """One Parquet shard; RolloutDirError naming it when it does not read."""
    try:
        with open_regular(path) as fh:
            return pq.read_table(fh)
    except (OSError, ValueError, pa.ArrowException) as e:   # truncated, empty, a FIFO, a folder
        raise RolloutDirError(f"{path}: not a readable Parquet shard ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:200] if str(e) else ''}); remove it and rerun "
                              f"memr1 rollout") from None


def completion_shard(path: Path) -> pa.Table:
    """One completions shard, checked to hold the writer's columns (shard_problem)."""
    table = read_shard(path)
    if (problem := shard_problem(table)) is not None:
        raise RolloutDirError(f"{path}: not a shard memr1 rollout wrote ({problem})")
    return table


def read_completions(out: Path, columns: list[str] | None = None) -> pa.Table:
    """Every finished shard's completions, in (step, rank) order; RolloutDirError naming the first
    shard that is not a Parquet file of the writer's columns."""
    files = sorted(out.glob("completions-s*-r*.parquet"))
    if not files:
        raise RolloutDirError(f"{out}: no completions-*.parquet shard there")
    tables = []
    for f in files:
        table = completion_shard(f)
        tables.append(table if columns is None else table.select(columns))
    try:
        return pa.concat_tables(tables, promote_options="default")
    except pa.ArrowException as e:   # reward parts of differing types across shards
        raise RolloutDirError(f"{out}: the shards do not concatenate ({str(e).splitlines()[0][:200]})") from None


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


def read_manifest(out: Path, what: str = "--out") -> dict:
    """manifest.json of a rollout folder, each member of its type (others dropped); RolloutDirError
    when it does not read as a memr1 rollout manifest."""
    try:
        manifest = json.loads(read_regular(out / "manifest.json", 64 << 20))
    except (OSError, ValueError, RecursionError) as e:   # not a file, not UTF-8, not JSON, nested deep
        raise RolloutDirError(f"{what} {out}: manifest.json is unreadable ({type(e).__name__}); use a new {what}") \
            from None
    if not isinstance(manifest, dict) or manifest.get("kind") != MANIFEST_KIND:
        raise RolloutDirError(f"{what} {out}: manifest.json is not a memr1 rollout manifest; use a new {what}")
    for key in ("what", "paths", "counts"):
        if not isinstance(manifest.get(key), dict):
            manifest[key] = None if key == "counts" else {}
    if not isinstance(manifest["what"].get("models"), dict):
        manifest["what"]["models"] = {}
    return manifest


def open_dir(out: Path, what: dict, commit: str | None, rank: int = 0, paths: dict | None = None) -> dict:
    """Create `out` with its manifest, or check that the one there describes the same rollouts (`what`;
    the commit and the models' `paths` are recorded, not compared); returns the manifest. This rank's
    leftover temporary files of a killed run are removed."""
    path = out / "manifest.json"
    what = json.loads(json.dumps(what))   # as it reads back (tuples become lists)
    if os.path.lexists(path):
        raw = read_manifest(out)
        if (key := first_difference(raw["what"], what)) is not None:
            raise RolloutDirError(f"--out {out} holds rollouts of another setting ({key} differs); use a new --out "
                                  f"or the same command")
        for tmp in out.iterdir():   # unlink removes a planted link itself, never its target
            if is_temporary(tmp.name) and (f"-r{rank}." in tmp.name or rank == 0 and "-r" not in tmp.name):
                tmp.unlink(missing_ok=True)
        return raw
    try:
        if out.exists() and any(out.iterdir()):
            raise RolloutDirError(f"--out {out}: a folder with files but no manifest.json; use an empty or new folder")
        out.mkdir(parents=True, exist_ok=True)
        manifest = {"kind": MANIFEST_KIND, "version": 1, "what": what, "commit": commit, "paths": paths or {},
                    "counts": None}
        write_json(path, manifest)
    except OSError as e:   # under a file, in /proc, read-only, full
        raise RolloutDirError(f"--out {out}: cannot write there ({e.strerror or e})") from None
    return manifest


def write_json(path: Path, value) -> None:
    write_atomic(path, json.dumps(value, indent=2, sort_keys=True) + "\n")
