"""One stage of `memr1 train`: its learner, checkpoints, validation, probe and profiler around the loop,
phase by phase (one phase unless an episode curriculum), from its start model or a verified checkpoint.

runs/<name>/<stage>/checkpoints/step_<N>/    self-contained HF model + optimizer, RNG and data state
runs/<name>/<stage>/best.json                with loop.validate_every: the step the stage hands on
"""
from __future__ import annotations

import time
from pathlib import Path

from memr1.engine.assembly import RunContext, make_stage
from memr1.engine.checkpoints import io as checkpoint
from memr1.engine.checkpoints.files import best_step, prune
from memr1.engine.checkpoints.io import final_checkpoint
from memr1.engine.checkpoints.resume import state_step
from memr1.engine.config.stages import stage_name
from memr1.engine.generation.weights import push_weights
from memr1.engine.loop import Loop, alone
from memr1.engine.observe.runlog import RunLog
from memr1.engine.training import dist as dist_utils
from memr1.engine.training.learner import Learner
from memr1.engine.validation import hand_on, phase_bounds, prober, validates, validator


def train_stage(ctx: RunContext, name: str, latest: dict, ckpt: Path | None = None,
                start_model: Path | None = None) -> tuple[Path, bool, int | None]:
    """Train one stage from `start_model` (default: its role's latest checkpoint, else the base model),
    or resume it from `ckpt` (a verified checkpoint of it); returns (the checkpoint it hands on,
    whether it finished, the signal that stopped it)."""
    run, cfg, policy = ctx.run, ctx.cfg, ctx.policy
    s = run.stage(name)
    stage_dir = run.run_dir / name
    if ckpt is not None and state_step(ckpt) >= s.steps:   # done: best.json's, else the one verified
        return (final_checkpoint(stage_dir) if best_step(stage_dir) is not None else ckpt), True, None
    start_model = start_model or latest.get(stage_name(name).role, run.base_model)
    stage = make_stage(ctx, name, latest)
    if run.rank == 0 and getattr(stage, "item_stats", None):
        st = stage.item_stats
        print(f"stage {name}: {st['items']} items from {st['calls']} calls, {st['guard_questions']} guard questions, "
              f"{st['unreachable_questions']} of {st['questions']} questions unreachable, dead_items {st['dead_items']}")
    learner = Learner(run.learner(name), str(start_model), lr=s.lr, temperature=run.temperature(name), seed=run.seed)
    start = 0
    if ckpt is not None:  # resume: same data order (items are picked by step), same weights
        start = int(checkpoint.load(learner, str(ckpt))["step"])
        if run.rank == 0:
            print(f"resuming {name} from {ckpt} at step {start}")
    push_weights(learner, policy, start)  # the engine may still hold the previous stage's policy
    if learner.lora_scale is not None and run.rank == 0:
        lo = run.learner(name).lora
        how = ("adapter-only updates (the base weights went once)" if policy.adapter_base == learner.base_token
               else "merged weights (its backend holds no adapters)")
        print(f"stage {name}: LoRA rank {lo.rank} on {', '.join(lo.targets)}: {learner.trainable_params:,} of "
              f"{learner.total_params:,} parameters train; the generator receives {how}")
    log = RunLog(run.run_dir, name, s.steps, start) if run.rank == 0 else None

    def save(step: int) -> None:
        checkpoint.save(learner, str(stage_dir), step, {"step": step}, model_dir=str(start_model))
        if run.rank == 0:
            prune(stage_dir, cfg.checkpoint.keep_last, step)

    bounds, validate = phase_bounds(run, name), None
    if validates(cfg, name):
        validate = validator(run, make_stage(ctx, name, latest, val=True), policy, stage_dir, save, bounds)
    probe = None
    if cfg.loop.probe_every and stage_name(name).kind in ("rl", "rs", "control"):
        # scored like the role's RL stage (a control's reward is RL's)
        probe = prober(run, make_stage(ctx, stage_name(name).of("rl"), latest, probe=True), policy)
        if start == 0 and log is not None:   # the curve's first point: the weights the stage starts from
            log({"step": 0, "stage": name, "phase_start": True, **probe(0)}, advance=False)
    profiler = None
    if cfg.profile.steps and run.rank == 0:   # rank 0's traces; other ranks run unprofiled
        from memr1.engine.observe.profiling import StepProfiler
        profiler = StepProfiler(cfg.profile.steps, run.run_dir / "profile" / name, cuda=learner.device.type == "cuda")
    try:
        out = {"steps_done": start, "stop_signal": None}
        for phase, (begin, end) in enumerate(bounds):   # one phase unless an episode curriculum
            if start >= end:
                continue
            fresh = start == begin and validate is not None   # a validating phase starts here (not resumed in it)
            if fresh and phase and not hand_on(run, stage_dir, phase, begin, learner, policy,
                                               print if run.rank == 0 else lambda *a: None):
                break   # the previous phase's best failed the gate
            if fresh and cfg.loop.validate_start:
                t0 = time.perf_counter()
                val = validate(begin, phase)
                if log is not None:
                    log({"step": begin, "stage": name, "phase_start": True, **val,
                         "val_s": time.perf_counter() - t0}, advance=False)
            out = Loop(stage, policy, learner, cfg.loop, end, on_step=log or (lambda m: None), save_checkpoint=save,
                       validate=validate, probe=probe, agree=dist_utils.agree_rollouts if run.world > 1 else alone,
                       profiler=profiler).run(start)
            if out["steps_done"] < end:
                break
            start = end
    finally:
        if log is not None:
            log.close()
        del learner
    return final_checkpoint(stage_dir), out["steps_done"] >= s.steps, out["stop_signal"]
