"""`memr1 rollout`: a stage's rollouts with given checkpoints, kept as Parquet shards; nothing trains.

The stage is built by `assembly.make_stage`, as `memr1 train` builds it, and each step is the stage's own
`rollout(step, generator)`: the same items, prompts, forks, frozen answers and rewards as training.
Two things differ from a training step, both so that output is reproducible:
- each step samples with its own seed (`step_seed`), so a rerun that skips finished shards, or a run
  resumed after kill -9, writes the rows an uninterrupted run writes;
- the policy's weights are the checkpoint's for the whole run (weight_version 1; 0 is the base model).
Under torchrun each rank rolls out its share of every step (items.step_items) and writes its own
shards; the union over ranks is the single process's rows when sampling is deterministic per item
(the 2-rank test samples with top_k = 1, as the data-parallel training test does).
Files: see rollout_files.py and rollout_summary.py; `memr1 report DIR` renders them (rollout_report.py).
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from memr1.engine.assembly import cli_models, make_stage, open_context
from memr1.engine.checkpoints.files import CheckpointError, tokenizer_digest, weights_digest
from memr1.engine.config.errors import ConfigError
from memr1.engine.config.resolve import resolve
from memr1.engine.config.run import load_config
from memr1.engine.config.stages import STAGES, stage_config, stage_name
from memr1.engine.rollout_files import RolloutDirError, done, open_dir, write_shard
from memr1.rl.task.data.locomo import DataError

# the stages that sample their replies (RL and episodes), from the one list of stages
RL_STAGES = tuple(s for s in STAGES if not stage_name(s).supervised)


def step_seed(seed: int, step: int) -> int:
    """The sampling seed of one step: fixed by the run seed and the step alone."""
    return (seed * 1_000_003 + step) % (2 ** 31 - 1)


def git_commit() -> str | None:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() or None if head.returncode == 0 else None


def torch_barrier() -> None:
    import torch.distributed

    torch.distributed.barrier()


def reduce_totals(totals: dict) -> dict:
    """This invocation's counts over ranks: counts add up, seconds (`*_s`) take the slowest rank."""
    import torch

    from memr1.engine.training.dist import all_reduce

    names = sorted(totals)
    values = torch.tensor([float(totals[k]) for k in names], dtype=torch.float64)
    summed, slowest = all_reduce(values.clone(), "sum"), all_reduce(values.clone(), "max")
    return {k: slowest[i].item() if k.endswith("_s") else summed[i].item() for i, k in enumerate(names)}


def writable_folder(out: Path, flag: str) -> None:
    """ConfigError unless `out`, or the nearest folder above it that exists, takes a new file: a folder
    under a file, in /proc or on a read-only file system fails here, before any model loads."""
    import os
    import tempfile

    probe = out
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"{flag} {out}: {probe} is not a folder")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        raise ConfigError(f"{flag} {out}: cannot write there ({e.strerror or e})") from None


def load(args) -> tuple:
    """(config, stage name, models) from the command line; each problem is a ConfigError."""
    name = args.stage
    if name not in RL_STAGES:
        raise ConfigError(f"--stage {name!r}: rollouts run an RL stage, one of {', '.join(RL_STAGES)}")
    if args.items is not None and args.items < 1:
        raise ConfigError(f"--items {args.items}: give at least 1")
    if args.group_size is not None and args.group_size < 1:
        raise ConfigError(f"--group-size {args.group_size}: give at least 1")
    out = Path(args.out).resolve()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {args.out} exists and is not a folder")
    writable_folder(out, "--out")
    import torch
    overrides = [f"stages={json.dumps([name])}", f"run_dir={out}"]
    if not torch.cuda.is_available():  # every call is seeded (see GeneratorConfig.chunked_prefill)
        overrides.append("generator.chunked_prefill=false")
    overrides += list(args.overrides)
    if args.group_size is not None:
        overrides.append(f"stage.{name}.group_size={args.group_size}")
    cfg = load_config(args.config, overrides)
    if args.items is not None:
        per_step = stage_config(cfg, name).prompts_per_step
        if args.items < per_step:   # one step of exactly the items asked for
            overrides.append(f"stage.{name}.prompts_per_step={args.items}")
            per_step = args.items
        if stage_name(name).kind != "episode":   # the episode stage's steps are its curriculum's
            # the train split's banks are built for the steps a run draws (items.RunItems.needed)
            overrides.append(f"stage.{name}.steps={math.ceil(args.items / per_step)}")
        cfg = load_config(args.config, overrides)
    elif args.split == "train":
        raise ConfigError("--split train needs --items N: the train split's items are drawn step by step")
    try:
        models = cli_models(args)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return cfg, name, models


def rollouts(cfg, name: str, split: str, models: dict, items_n: int | None, say=print) -> dict:
    """Roll out `name` on `split` into cfg.run_dir; returns the summary (rank 0) or {}."""
    from memr1.engine.observe import quiet
    from memr1.engine.rollout_summary import summarize
    from memr1.engine.training import dist as dist_utils

    t_start = time.perf_counter()
    rank, world = dist_utils.init(cfg.learner.device)
    try:
        run = resolve(cfg, rank, world, trains=False)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    out, role = run.run_dir.resolve(), stage_name(name).role
    used = {r: models[r] for r in ("manager", "answer") if r in models}
    what = {"stage": name, "split": split, "items": items_n, "world": world, "config": msgspec.to_builtins(cfg),
            # each checked and hashed before any weight of it is used (checkpoints/files.py)
            "tokenizer": tokenizer_digest(run.base_model),   # --from-rollouts replays under the same ids only
            "models": {"base": weights_digest(run.base_model, "base model"),
                       **{r: weights_digest(p, f"{r} checkpoint") for r, p in used.items()}}}
    barrier = torch_barrier if world > 1 else (lambda: None)
    paths = {"base": str(run.base_model), **{r: str(Path(p).resolve()) for r, p in used.items()}}
    if rank == 0:
        open_dir(out, what, git_commit(), paths=paths)
    barrier()
    if rank:
        open_dir(out, what, git_commit(), rank)
    try:
        quiet.log_to(out)
    except OSError as e:   # run.log planted as a link or a FIFO
        raise RolloutDirError(f"--out {out}: cannot keep run.log there ({e.strerror or e})") from None
    # the stage's role samples from its checkpoint; the other role's is the frozen one (`latest`)
    ctx = open_context(run, split, policy_model=used.get(role))
    policy = ctx.policy
    try:
        stage = make_stage(ctx, name, latest=dict(used))
        pool = stage.items_for(stage.phase(0).sessions) if stage_name(name).kind == "episode" else stage.items
        per_step = run.stage(name).prompts_per_step
        steps = math.ceil((items_n or len(pool)) / per_step)
        base = stage.ctx
        totals = {"steps": 0, "skipped": 0, "rows": 0, "response_tokens": 0, "forks": 0, "bank_ops": 0,
                  "step_s": 0.0, "write_s": 0.0}
        setup_s, t_loop = time.perf_counter() - t_start, time.perf_counter()
        for step in range(steps):
            if done(out, step, rank):
                totals["skipped"] += 1
                continue
            stage.ctx = base.with_sampling(msgspec.structs.replace(base.sampling, seed=step_seed(cfg.seed, step)))
            t0 = time.perf_counter()
            result = stage.rollout(step, policy)
            t1 = time.perf_counter()
            totals["rows"] += write_shard(out, step, rank, result, t1 - t0)
            totals["write_s"] += time.perf_counter() - t1
            totals["step_s"] += t1 - t0
            totals["steps"] += 1
            for key in ("response_tokens", "forks", "bank_ops"):
                totals[key] += result.metrics.get(key, 0)
            say(f"step {step + 1}/{steps}: {len(result.samples)} completions, reward "
                f"{result.metrics.get('reward_mean', 0.0):.3f}, {t1 - t0:.1f}s")
        totals["loop_s"], totals["setup_s"] = time.perf_counter() - t_loop, setup_s
    finally:
        ctx.close()
    totals = reduce_totals(totals) if world > 1 else totals
    barrier()
    summary = summarize(out, totals) if rank == 0 else {}
    dist_utils.finish()
    return summary


def rollout_cli(args) -> int:
    try:
        cfg, name, models = load(args)
        summary = rollouts(cfg, name, args.split, models, args.items)
    except (ConfigError, DataError, CheckpointError, RolloutDirError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if summary:
        t = summary["throughput"]
        print(f"{summary['counts']['rows']} completions in {summary['counts']['shards']} shards; "
              f"{t.get('rollouts_per_s') or 0:.2f} rollouts/s this run; wrote {Path(cfg.run_dir) / 'summary.json'}")
    return 0
