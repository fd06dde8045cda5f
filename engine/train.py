"""`memr1 train`: the configured stages, in order, through the one loop, into a run directory.

runs/<name>/config.toml                      the config as given (overrides applied)
runs/<name>/metrics.jsonl                    one JSON object per step (every stage)
runs/<name>/tb/<stage>/                      TensorBoard
runs/<name>/<stage>/                         its checkpoints and best.json (stage_driver.py)
runs/<name>/eval/                            with eval_after: reports and the comparison (see compare.py)
Stages: "answer_warm", "answer", "manager_warm", "manager" in any order. A stage starts from its role's
newest checkpoint in this run (so "answer" continues "answer_warm"), else the base model. A
"<role>_control" stage (after its warm start) trains the warm checkpoint further with the supervised
loss on the RL stage's prompts, and hands on nothing: it is the control the RL stage is compared with. The manager
stage's frozen answer agent and the answer stage's bank-building manager are config
(stage.frozen_answer, stage.bank_manager); "latest" means the run's newest checkpoint of that role.
Under torchrun every rank rolls out and trains its own share of each step's prompts (see loop.py);
rank 0 alone writes config, metrics, tb/ and runs the final evaluation.
A SIGINT/SIGTERM checkpoints the current stage and ends the run there (later stages and the evals
do not run); `memr1 train --resume RUN_DIR` continues from that point, after the checks of
checkpoints/resume.py (config changes, damaged checkpoints, metrics past the checkpoints).
The run's engines, items and stages are assembled once (assembly.py); each stage trains in
stage_driver.py; the final evaluation is compare.py's.
"""
import json
import sys
import time
from pathlib import Path

import msgspec

from memr1.engine.assembly import check_data, open_context
from memr1.engine.checkpoints.files import CheckpointError
from memr1.engine.checkpoints.resume import check_resume_config, resume_points
from memr1.engine.config.errors import ConfigError
from memr1.engine.config.plan import plan_text
from memr1.engine.config.resolve import budget_warnings, env_world, resolve
from memr1.engine.config.run import RunConfig, check_writable, load_config, make_run_dir
from memr1.engine.config.stages import stage_name
from memr1.engine.config.toml_out import dump_toml
from memr1.engine.observe import quiet
from memr1.engine import replay
from memr1.engine.stage_driver import train_stage
from memr1.engine.training import dist as dist_utils
from memr1.engine.validation import validates
from memr1.rl.task.data.locomo import DataError


def train(cfg: RunConfig, recording: replay.Recording | None = None) -> dict:
    """`recording`: rollout.replay's folders as train_cli read them (read here when not given)."""
    from memr1.engine.compare import evaluate_after

    # Under torchrun, join the process group before any engine exists, so vLLM joins it too.
    env_world()   # a WORLD_SIZE that is no rank count stops here, as one error line
    recording = recording or replay.load(cfg)
    cfg = replay.configure(cfg, recording)   # the same config train_cli planned
    rank, world = dist_utils.init(cfg.learner.device)
    try:
        run = resolve(cfg, rank, world)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    say = print if rank == 0 else (lambda *a, **k: None)
    check_data(cfg)
    if recording is not None:   # before any engine starts
        replay.check_models(recording, run.base_model, say)
    make_run_dir(run.run_dir)
    quiet.log_to(run.run_dir)
    # Before any engine starts: a run whose checkpoints are all damaged stops here.
    resume = resume_points(run.run_dir, cfg.stages, rank, say)
    if rank == 0:
        (run.run_dir / "config.toml").write_text(dump_toml(cfg))
    for warning in budget_warnings(cfg):
        say(f"warning: {warning}")
    # the engines (the swapping one serves the frozen answer agent, bank-building managers, extraction
    # and the evals), the embedder and the items, built once for every stage
    ctx = open_context(run, "train", validate=any(validates(cfg, n) for n in cfg.stages), replay=recording)
    say(f"{len(ctx.items.convs)} train conversations" + (f", {world} data-parallel ranks" if world > 1 else ""))
    latest: dict[str, Path] = {}   # role -> the checkpoint its newest stage handed on
    finals, stopped, stop_signal = {}, None, None
    try:
        for name in cfg.stages:
            t = time.perf_counter()
            # A control continues its role's warm start and hands on nothing: later stages use the RL policy.
            # It sees the run as its RL stage did: its own role's latest checkpoint is the warm start.
            n = stage_name(name)
            start = finals.get(n.of("warm")) if n.baseline else None
            seen = {**latest, n.role: start} if n.baseline and start is not None else latest
            final, done, signum = train_stage(ctx, name, seen, resume[name], start)
            if final is not None:
                finals[name] = final
                if not n.baseline:
                    latest[n.role] = final
            say(f"stage {name}: {time.perf_counter() - t:.0f}s, hands on {final}")
            if not done:
                stopped, stop_signal = name, signum
                say(f"stopped during stage {name}; `memr1 train --resume {run.run_dir}` continues from its checkpoint"
                    if signum else f"stage {name} ends before its last phase (the promotion gate above); the run stops")
                break
    finally:
        ctx.close()
    evals = {}
    if rank == 0 and stopped is None and cfg.eval_after:
        evals = evaluate_after(run, finals, ctx.swap.generator)
    dist_utils.finish()
    return {"run_dir": str(run.run_dir), "checkpoints": {k: str(v) for k, v in finals.items()}, "evals": evals,
            "stopped": stopped, "stop_signal": stop_signal, "rank": rank, "world": world}


def train_cli(args) -> int:
    try:
        allowed = [k.strip() for item in getattr(args, "allow_config_change", None) or [] for k in item.split(",")
                   if k.strip()]
        if allowed and not args.resume:
            raise ConfigError("--allow-config-change goes with --resume RUN_DIR")
        if args.resume and getattr(args, "from_rollouts", None):
            raise ConfigError("--resume continues the run's own rollout.replay; drop --from-rollouts")
        if args.resume:
            resolved = Path(args.resume) / "config.toml"
            if not resolved.is_file():
                raise ConfigError(f"--resume {args.resume}: no config.toml there; is it a run directory?")
            if args.config:
                raise ConfigError("--resume takes the run's own config.toml; drop --config (or start a new run)")
            cfg = load_config(resolved, args.overrides)
            check_resume_config(args.resume, load_config(resolved), cfg, allowed)
            # The run lives where --resume points, wherever this is started from.
            cfg = msgspec.structs.replace(cfg, run_dir=str(Path(args.resume).resolve()))
        elif args.config:
            folders = [f"rollout.replay={json.dumps(args.from_rollouts)}"] if getattr(args, "from_rollouts", None) else []
            cfg = load_config(args.config, [*args.overrides, *folders])
        else:
            raise ConfigError("memr1 train needs --config FILE or --resume RUN_DIR")
        recording = replay.load(cfg)   # --from-rollouts: the recorded stage alone, a step per recorded step
        cfg = replay.configure(cfg, recording)
        if getattr(args, "profile", False) and not cfg.profile.steps:
            from memr1.engine.observe.profiling import DEFAULT_STEPS, ProfileConfig
            cfg = msgspec.structs.replace(cfg, profile=ProfileConfig(steps=list(DEFAULT_STEPS)))
        text, fits = plan_text(cfg, dry_run=args.dry_run)
        if args.dry_run:   # the paths the run would write, checked as it would find them (nothing is created)
            check_writable(cfg.resolved_run_dir(), "run_dir")
            if cfg.cache_dir:
                check_writable(Path(cfg.cache_dir), "cache_dir")
            print(text)
            return 0 if fits else 2
        if not fits:
            print(text)
            raise ConfigError("the plan does not fit this machine (see above); nothing was started")
        out = train(cfg, recording)
    except (ConfigError, DataError, CheckpointError) as e:   # user errors: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    if out["rank"] == 0:
        print(json.dumps(out, indent=2))
        from memr1.engine.observe.report import report_quietly
        report_quietly(Path(out["run_dir"]))
    if out["stopped"] is None:
        return 0
    return 128 + out["stop_signal"] if out["stop_signal"] else 3   # the shell's code for death by that signal
