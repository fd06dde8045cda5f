"""Validation during a stage, and the session curriculum that hands its best checkpoints on.

An RL stage with `loop.validate_every` (and in `loop.validate_stages`, unless that is empty) scores the
val split greedily every N steps; each new best is checkpointed and named in `<stage>/best.json`, and
the stage hands that checkpoint on. With `loop.validate_start` each phase's starting weights are
scored before it trains (and checkpointed under the phase's first step number), so they are a
candidate too. The session curriculum of an episode stage (rl/task/episodes.py, `episode.curriculum`): the
stage's steps run phase by phase, and each phase after the first starts from the previous phase's
best-validation checkpoint (when the stage validates) once that checkpoint passes the promotion gate
on the evidence-miss rate. Other stages are one phase of all their steps.
"""
from __future__ import annotations

import json
from pathlib import Path

from memr1.engine.checkpoints import io as checkpoint
from memr1.engine.config.stages import stage_name
from memr1.engine.generation.weights import push_weights
from memr1.engine.training.dist import reduce_metrics


def validates(cfg, name: str) -> bool:
    """Whether stage `name` validates: loop.validate_every is set, the stage learns from a reward, and
    loop.validate_stages is empty or names it."""
    return bool(cfg.loop.validate_every) and not stage_name(name).supervised and \
        (not cfg.loop.validate_stages or name in cfg.loop.validate_stages)


def phase_bounds(run, name: str) -> list[tuple[int, int]]:
    """[(first step, one past the last step)] of each phase of stage `name` (0-based steps)."""
    steps = run.stage(name).steps
    return run.cfg.episode.bounds(steps) if stage_name(name).kind == "episode" else [(0, steps)]


def phase_of(bounds: list[tuple[int, int]], step: int) -> int:
    """The phase that trained step number `step` (1-based, as the loop counts) belongs to."""
    return next((i for i, (begin, end) in enumerate(bounds) if begin < step <= end), len(bounds) - 1)


def hand_on(run, stage_dir: Path, phase: int, begin: int, learner, policy, say=print) -> bool:
    """Before phase `phase` of a validating stage starts at step `begin`: load the previous phase's
    best-validation checkpoint into the learner and the policy engine. False (stop the stage) when that
    checkpoint fails the gate."""
    best_file = stage_dir / "best.json"
    if not best_file.is_file():
        return True   # no validation yet: the phase goes on from the weights the last one ended with
    best = json.loads(best_file.read_text())
    if best.get("phase") != phase - 1:
        return True
    miss, gate = best.get("evidence_miss"), run.cfg.episode.max_evidence_miss
    if miss is not None and miss > gate:
        say(f"stage manager_episode: phase {phase} not started: the best checkpoint of phase {phase - 1} "
            f"(step {best['step']}) misses {miss:.3f} of the evidence, above episode.max_evidence_miss={gate}")
        return False
    checkpoint.load(learner, str(stage_dir / "checkpoints" / f"step_{best['step']}"))
    learner.continue_at(begin)   # the loop's counters go on from the phase's first step
    push_weights(learner, policy, begin)
    say(f"stage manager_episode: phase {phase} starts from step {best['step']}, the best of phase {phase - 1}")
    return True


def validator(run, val_stage, policy, stage_dir: Path, save, bounds: list[tuple[int, int]]):
    """loop.validate: the stage's greedy outcome score on the val items; each new best of the current
    phase is checkpointed and recorded in best.json (with its phase), and the stage hands it on."""
    key = f"reward_{run.cfg.reward.kind}"
    best = json.loads((stage_dir / "best.json").read_text()) if (stage_dir / "best.json").is_file() else None

    def validate(step: int, phase: int | None = None) -> dict:
        """Score the weights of `step` (`phase`: the phase they start, for a phase's starting weights)."""
        nonlocal best
        phase = phase_of(bounds, step) if phase is None else phase
        # the rollout of the phase's windows: step s's weights score rollout s - 1, a phase's start its first
        metrics = val_stage.rollout(max(step - 1, bounds[phase][0]), policy).metrics
        if run.world > 1:
            metrics = reduce_metrics(metrics, run.world)
        out = {f"val_{k}": metrics[k] for k in ("reward_mean", key, "em_mean", "f1_mean", "parse_failure_rate",
                                                 "evidence_miss") if k in metrics}
        score, start = out[f"val_{key}"], step == bounds[phase][0]
        # a later phase scores longer windows, so its scores start afresh; a trained checkpoint replaces
        # a tie of the phase's start (trained and no worse), not a trained tie
        if best is None or best.get("phase", 0) != phase or score > best["score"] or \
                (score == best["score"] and best.get("start") and not start):
            save(step)
            best = {"step": step, "score": score, "metric": key, "phase": phase,
                    "evidence_miss": out.get("val_evidence_miss"), "start": start}
            if run.rank == 0:
                (stage_dir / "best.json").write_text(json.dumps(best))
        return out
    return validate


def prober(run, probe_stage, policy):
    """loop.probe: the policy's greedy outcome score on the train items held out for the probe curve
    (`RunItems.carve`), as `probe_*` metrics; it picks no checkpoint. The same items every time, so
    its curve moves only with the policy, unlike the batch mean, whose items change every step."""
    def probe(step: int) -> dict:
        metrics = probe_stage.rollout(0, policy).metrics
        if run.world > 1:
            metrics = reduce_metrics(metrics, run.world)
        return {f"probe_{k}": metrics[k] for k in ("reward_mean", "em_mean", "f1_mean", "parse_failure_rate")
                if k in metrics}
    return probe
