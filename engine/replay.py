"""`memr1 train --config X --from-rollouts DIR [DIR ...]`: train a stage on rollouts `memr1 rollout`
recorded (rollout_files.py), instead of generating them. Rollouts made on cheap inference machines, or
kept from an expensive run, train the stage they were written for, through the same loop and learner.

- One training step per recorded step: the step's groups from every rank that wrote it, in rank order
  (the union a single process would have drawn); folders follow each other in the order given. Under
  torchrun each rank trains every world-th group of a step.
- The shards' behaviour log-probs are what the sampling policy gave; the learner corrects for the gap to
  its own weights with the importance weights it applies online (`learner.loss.is_cap`, `learner.anchor`),
  so shards of an older policy train off-policy, corrected as far as the cap allows.
- Refused in one line before any engine starts: folders of different stages; a stage other than the
  call-level RL stages (episode shards keep no credit levels, rejection-sampling shards only the kept
  replies); shards written for another base model or tokenizer (the manifest's SHA-256 of each, checked
  against the config's base model); a folder with no finished step.
The folders are read once (`load`), before the plan; the run hands that Recording on to the stage.
Validation and the probe still generate, with the learner's weights pushed as in any run.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec

from memr1.engine.config.errors import ConfigError
from memr1.engine.rollout_files import (RolloutDirError, completion_shard, done, read_manifest, read_shard, recorded,
                                        shard_name)
from memr1.rl.records import Group, Rollout, TrainBatch
from memr1.rl.task.stages.calls import reward_metrics

REPLAYABLE = ("manager", "answer")


@dataclass(frozen=True)
class RecordedStep:
    """One recorded step: its shards (prompts, completions), one pair per rank that wrote it."""
    folder: Path
    step: int
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Recording:
    """What --from-rollouts folders hold: the stage, what the manifests recorded of its models, and the
    finished steps in training order."""
    stage: str
    models: dict            # the first folder's {"base": digest, role: digest}
    tokenizer: str | None
    steps: tuple[RecordedStep, ...]


def read_recording(folders: list[str]) -> Recording:
    """Every folder's manifest and finished steps; ConfigError (one line) naming what does not fit."""
    if not folders:
        raise ConfigError("--from-rollouts needs at least one rollout folder")
    stage, first, steps = None, None, []
    for f in folders:
        out = Path(f)
        if not out.is_dir():
            hint = " (key=value overrides go before --from-rollouts)" if "=" in f else ""
            raise ConfigError(f"--from-rollouts {f}: not a folder{hint}")
        try:
            what = read_manifest(out, "--from-rollouts")["what"]
        except RolloutDirError as e:
            raise ConfigError(str(e)) from None
        name = what.get("stage")
        if name not in REPLAYABLE:
            raise ConfigError(f"--from-rollouts {f}: written for stage {name!r}; replay trains the call-level RL "
                              f"stages ({', '.join(REPLAYABLE)}): episode shards keep no credit levels")
        if stage is None:
            stage, first = name, what
        elif name != stage:
            raise ConfigError(f"--from-rollouts {f}: written for stage {name}, but {folders[0]} for {stage}; "
                              f"give folders of one stage")
        elif what.get("models", {}).get("base") != first.get("models", {}).get("base") \
                or what.get("tokenizer") != first.get("tokenizer"):
            raise ConfigError(f"--from-rollouts {f}: written with another base model or tokenizer than {folders[0]}")
        world = what.get("world") if isinstance(what.get("world"), int) and what.get("world") > 0 else 1
        ledgers = {r: recorded(out, r) for r in range(world)}
        numbers = sorted({int(n.split("-s")[1].split("-")[0]) for led in ledgers.values() for n in led
                          if n.startswith("completions-s")})
        for s in numbers:
            ranks = tuple(r for r in range(world) if done(out, s, r, ledgers[r]))
            if len(ranks) == world:   # a step some rank has not finished is left out whole
                steps.append(RecordedStep(out, s, ranks))
        if not any(st.folder == out for st in steps):
            raise ConfigError(f"--from-rollouts {f}: no step there is finished on every rank; run memr1 rollout "
                              f"to the end first")
    return Recording(stage, dict(first.get("models") or {}), first.get("tokenizer"), tuple(steps))


def load(cfg) -> Recording | None:
    """The config's recording (rollout.replay), or None when it trains on generated rollouts."""
    return read_recording(list(cfg.rollout.replay)) if cfg.rollout.replay else None


def configure(cfg, rec: Recording | None):
    """The config a replayed run trains with (unchanged without a recording): the recorded stage
    alone, one step per recorded step."""
    if rec is None:
        return cfg
    stage = msgspec.structs.replace(getattr(cfg.stage, rec.stage), steps=len(rec.steps))
    return msgspec.structs.replace(cfg, stages=[rec.stage],
                                   stage=msgspec.structs.replace(cfg.stage, **{rec.stage: stage}))


def check_models(rec: Recording, base_model: Path, say=print) -> None:
    """ConfigError unless the shards were written for this base model and tokenizer."""
    from memr1.engine.checkpoints.files import tokenizer_digest, weights_digest

    if rec.models.get("base") != weights_digest(base_model, "base model"):
        raise ConfigError(f"--from-rollouts: the shards were written for another base model than {base_model} "
                          f"(its weights' SHA-256 differs); give the config that rolled them out")
    if rec.tokenizer is None:
        raise ConfigError("--from-rollouts: the manifest records no tokenizer digest (written by an older memr1 "
                          "rollout); roll the shards out again")
    if rec.tokenizer != tokenizer_digest(base_model):
        raise ConfigError(f"--from-rollouts: the shards were tokenized by another tokenizer than {base_model}'s")
    say(f"replaying {len(rec.steps)} recorded steps of stage {rec.stage}")


def step_groups(step: RecordedStep) -> tuple[list[Group], int]:
    """The groups of one recorded step, rank by rank in prompt order, and the weight version that
    sampled them."""
    groups, version = [], 0
    for rank in step.ranks:
        completions = completion_shard(step.folder / shard_name("completions", step.step, rank))
        prompts = {r["prompt_key"]: r for r in
                   read_shard(step.folder / shard_name("prompts", step.step, rank)).to_pylist()}
        parts = [n[len("reward_"):] for n in completions.column_names if n.startswith("reward_")]
        by_key: dict[str, list[dict]] = {}
        for row in completions.to_pylist():
            by_key.setdefault(row["prompt_key"], []).append(row)
            version = row["weight_version"]
        for key in sorted(by_key, key=lambda k: prompts[k]["group"] if k in prompts else -1):
            if key not in prompts:
                raise RolloutDirError(f"{step.folder}: step {step.step} rank {rank}: completions of prompt {key} "
                                      f"but no such prompt")
            rows = sorted(by_key[key], key=lambda r: r["index"])
            behav = [r["behav_logprobs"] for r in rows]
            groups.append(Group(
                prompt_ids=prompts[key]["prompt_ids"], responses=[r["completion_ids"] for r in rows],
                behav_logprobs=None if any(b is None for b in behav) else behav,
                rewards=[r["reward"] for r in rows],
                breakdown={p: [r[f"reward_{p}"] for r in rows] for p in parts
                           if all(r[f"reward_{p}"] is not None for r in rows)},
                truncated=[r["truncated"] for r in rows], source=prompts[key]["source"]))
    return groups, version


class ReplayStage:
    """The loop's stage for a replayed run: step s is the s-th recorded step (this rank's share)."""

    def __init__(self, name: str, steps: tuple[RecordedStep, ...], rank: int = 0, world: int = 1):
        self.name, self.steps, self.rank, self.world = name, steps, rank, world

    def rollout(self, step: int, generator) -> Rollout:
        recorded_step = self.steps[step]
        groups, version = step_groups(recorded_step)
        mine = groups[self.rank::self.world]
        metrics = {**reward_metrics(mine), "groups": len(mine), "completions": sum(len(g) for g in mine),
                   "response_tokens": sum(g.response_tokens for g in mine), "replayed_step": recorded_step.step}
        return Rollout(TrainBatch(mine, weight_version=version), metrics)
