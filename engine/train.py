"""`memr1 train`: the configured stages, in order, through the one loop, into a run directory.

runs/<name>/config.toml                      the config as given (overrides applied)
runs/<name>/metrics.jsonl                    one JSON object per step (every stage)
runs/<name>/tb/<stage>/                      TensorBoard
runs/<name>/<stage>/checkpoints/step_<N>/    self-contained HF model + optimizer, RNG and data state
runs/<name>/<stage>/best.json                with loop.validate_every: the step the stage hands on
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
"""
import json
import sys
import time
from pathlib import Path

import msgspec

from memr1.engine.checkpoints.files import CheckpointError, best_step, prune
from memr1.engine.checkpoints import io as checkpoint
from memr1.engine.checkpoints.io import final_checkpoint
from memr1.engine.checkpoints.resume import check_resume_config, resume_points, state_step
from memr1.engine.config.errors import ConfigError
from memr1.engine.config.judge import make_judge
from memr1.engine.config.plan import plan_text
from memr1.engine.config.resolve import Resolved, budget_warnings, env_world, resolve
from memr1.engine.config.run import RunConfig, check_writable, load_config, make_embedder, make_run_dir
from memr1.engine.config.stages import stage_name
from memr1.engine.config.toml_out import dump_toml
from memr1.engine.generation import make_generator
from memr1.engine.generation.weights import push_weights
from memr1.engine.loop import Loop, alone
from memr1.engine.observe import quiet
from memr1.engine.observe.runlog import RunLog
from memr1.engine.training import dist as dist_utils
from memr1.engine.training.learner import Learner
from memr1.engine.validation import hand_on, phase_bounds, prober, validates, validator
from memr1.rl.data.locomo import DataError
from memr1.rl.generation import GREEDY


def pick(setting: str, latest: dict, role: str, base: Path) -> Path:
    """stage.frozen_answer / stage.bank_manager: "latest", "base" or a checkpoint folder."""
    if setting == "latest":
        return latest.get(role, base)
    return base if setting == "base" else Path(setting)


def make_stage(run: Resolved, name: str, items, embedder, tokenizer, swap, latest: dict, val: bool = False,
               probe: bool = False):
    """The stage object for the loop (for validation: greedy, one completion per val item; `probe`:
    the same, on the train items `loop.probe_items` holds out of training)."""
    from memr1.rl.algos.rejection import RejectionStage
    from memr1.rl.hints import Hints
    from memr1.rl.stages import AnswerStage, ManagerStage, StageConfig
    from memr1.rl.warm import WarmStage

    cfg, n = run.cfg, stage_name(name)
    role, scfg = n.role, run.stage(name)
    rank, world = run.rank, run.world
    bank_manager = pick(cfg.stage.bank_manager, latest, "manager", run.base_model)
    if n.scripted:   # a warm start (or format start), or a control on the RL stage's own items
        if n.kind == "warm" and (scfg.pool_seed is not None or scfg.examples):
            its, convs = items.format_pool(role, scfg.pool_seed, scfg.examples)
        else:
            its, convs = rl_items(run, items, n.of("rl") if n.kind == "control" else name, bank_manager), items.by_id
        return WarmStage(role, its, convs, embedder, tokenizer, scfg, run.task, rank, world, name)
    sampling = run.rollout_sampling(role)
    judge = make_judge(cfg, swap.view(run.base_model))
    if n.kind == "episode":
        return episode_stage(run, items, embedder, swap, latest, judge, val)
    its = rl_items(run, items, name, bank_manager, probe)
    if val or probe:  # every item once, greedy; the rank's share when data parallel
        its = its[: len(its) // world * world]
        scfg = StageConfig(steps=1, prompts_per_step=len(its), group_size=1, lr=scfg.lr)
        sampling = GREEDY.with_tokens(sampling.max_new_tokens)
    refill = 0 if val or probe or not cfg.rollout.refill else \
        max(1, (cfg.rollout.refill_max_prompts or scfg.prompts_per_step) // world)   # this rank's share
    if role == "manager":
        frozen = swap.view(pick(cfg.stage.frozen_answer, latest, "answer", run.base_model))
        hint_n = getattr(scfg, "hints", 0)   # a control's settings carry no hints
        hints = Hints(hint_n, items.by_id, run.task.manager.list_unchanged) if not val and hint_n else None
        stage = ManagerStage(its, frozen, embedder, scfg, sampling, run.task, cfg.reward, judge, rank, world, hints,
                             refill)
        stage.item_stats = items.manager_stats(name, bank_manager)
    else:
        stage = AnswerStage(its, embedder, scfg, sampling, run.task, cfg.reward, judge, rank, world, refill)
    return RejectionStage(stage, name) if n.kind == "rs" and not (val or probe) else stage


def n_rl(name: str) -> str:
    """The RL stage a stage's probe scores like: the role's RL stage (a control's reward is RL's)."""
    return stage_name(name).of("rl")


def rl_items(run: Resolved, items, name: str, bank_manager: Path, probe: bool = False) -> list:
    """The items stage `name` trains on (`probe`: the train items `loop.probe_items` holds out of them)."""
    if stage_name(name).role == "manager":
        return items.manager(name, bank_manager, probe)
    return items.answer(name, bank_manager, probe)


def episode_stage(run: Resolved, items, embedder, swap, latest: dict, judge, val: bool):
    """The manager_episode stage (rl/episode_stage.py); for validation: every val window once, one
    greedy episode each, no re-rolls."""
    from memr1.rl.episode_stage import EpisodeStage

    cfg, scfg, episode = run.cfg, run.stage("manager_episode"), run.cfg.episode
    sampling = run.rollout_sampling("manager")
    if val:
        scfg = msgspec.structs.replace(scfg, group_size=1)
        sampling = GREEDY.with_tokens(sampling.max_new_tokens)
        episode = msgspec.structs.replace(episode, reroll_prob=0.0)
    frozen = swap.view(pick(cfg.stage.frozen_answer, latest, "answer", run.base_model))
    return EpisodeStage(items.episodes, frozen, embedder, scfg, sampling, run.task, cfg.reward, episode, judge,
                        run.rank, run.world, run.seed, validation=val)


def train_stage(run: Resolved, name: str, items, val_items, embedder, policy, swap, latest: dict,
                ckpt: Path | None = None, start_model: Path | None = None) -> tuple[Path, bool, int | None]:
    """Train one stage from `start_model` (default: its role's latest checkpoint, else the base model),
    or resume it from `ckpt` (a verified checkpoint of it); returns (the checkpoint it hands on,
    whether it finished, the signal that stopped it)."""
    cfg, s = run.cfg, run.stage(name)
    stage_dir = run.run_dir / name
    if ckpt is not None and state_step(ckpt) >= s.steps:   # done: best.json's, else the one verified
        return (final_checkpoint(stage_dir) if best_step(stage_dir) is not None else ckpt), True, None
    start_model = start_model or latest.get(stage_name(name).role, run.base_model)
    stage = make_stage(run, name, items, embedder, policy.tokenizer, swap, latest)
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
    log = RunLog(run.run_dir, name, s.steps, start) if run.rank == 0 else None

    def save(step: int) -> None:
        checkpoint.save(learner, str(stage_dir), step, {"step": step}, model_dir=str(start_model))
        if run.rank == 0:
            prune(stage_dir, cfg.checkpoint.keep_last, step)

    bounds, validate = phase_bounds(run, name), None
    if validates(cfg, name):
        validate = validator(run, make_stage(run, name, val_items, embedder, policy.tokenizer, swap, latest, val=True),
                             policy, stage_dir, save, bounds)
    probe = None
    if cfg.loop.probe_every and stage_name(name).kind in ("rl", "rs", "control"):
        probe = prober(run, make_stage(run, n_rl(name), items, embedder, policy.tokenizer, swap, latest, probe=True),
                       policy)
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


def check_train_data(cfg: RunConfig) -> None:
    """Stop a run whose data has nothing to train on, or nothing to validate on when a stage validates,
    before any engine starts."""
    from memr1.rl.data import detect_format, load_conversations

    validating = [name for name in cfg.stages if validates(cfg, name)]
    if validating and not load_conversations(cfg.data.path or None, cfg.data.n, cfg.data.seed, split="val"):
        where = f"data.path={cfg.data.path}" if cfg.data.path else f"the synthetic set at data.n={cfg.data.n}"
        raise DataError(f"loop.validate_every={cfg.loop.validate_every}: {', '.join(validating)} would validate on the "
                        f"val split, and {where} has no val conversation; set loop.validate_every=0 or give it one")
    if not cfg.data.path or load_conversations(cfg.data.path, split="train"):
        return   # the synthetic set always has train conversations (index 0 is one)
    why = {"longmemeval": "it is a LongMemEval file, an evaluation set (all its items are in split test)",
           "msc": "it is an MSC-Self-Instruct file, an evaluation set (all its rows are in split test)"}.get(
        detect_format(cfg.data.path), "none of its conversations is in split train (memr1_split, or conv-26 in "
                                      "locomo10)")
    raise DataError(f"data.path={cfg.data.path}: nothing to train on: {why}; evaluate it with "
                    f"`memr1 eval --split test`")


def train(cfg: RunConfig) -> dict:
    from memr1.engine.compare import evaluate_after
    from memr1.engine.generation.swap import WeightSwap
    from memr1.engine.items import RunItems

    # Under torchrun, join the process group before any engine exists, so vLLM joins it too.
    env_world()   # a WORLD_SIZE that is no rank count stops here, as one error line
    rank, world = dist_utils.init(cfg.learner.device)
    try:
        run = resolve(cfg, rank, world)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    say = print if rank == 0 else (lambda *a, **k: None)
    check_train_data(cfg)
    make_run_dir(run.run_dir)
    quiet.log_to(run.run_dir)
    # Before any engine starts: a run whose checkpoints are all damaged stops here.
    resume = resume_points(run.run_dir, cfg.stages, rank, say)
    if rank == 0:
        (run.run_dir / "config.toml").write_text(dump_toml(cfg))
    for warning in budget_warnings(cfg):
        say(f"warning: {warning}")
    embedder = make_embedder(cfg)
    # Two engines serve the whole run: the policy being trained, and one whose weights swap between
    # roles (the frozen answer agent, bank-building managers, extraction, the evals). Under torchrun
    # each rank has its own pair, made in the same order (vLLM's creation is collective).
    policy = make_generator(cfg.generator, cfg.seed)
    swap = WeightSwap(make_generator(cfg.generator, cfg.seed), loaded=run.base_model)
    items = RunItems(run, embedder, swap, "train")
    val_items = RunItems(run, embedder, swap, "val") if any(validates(cfg, n) for n in cfg.stages) else None
    say(f"{len(items.convs)} train conversations" + (f", {world} data-parallel ranks" if world > 1 else ""))
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
            final, done, signum = train_stage(run, name, items, val_items, embedder, policy, swap, seen, resume[name],
                                              start)
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
        for built in (items, val_items):
            if built is not None:
                built.close()
    evals = {}
    if rank == 0 and stopped is None and cfg.eval_after:
        evals = evaluate_after(run, finals, swap.generator)
    dist_utils.finish()
    return {"run_dir": str(run.run_dir), "checkpoints": {k: str(v) for k, v in finals.items()}, "evals": evals,
            "stopped": stopped, "stop_signal": stop_signal, "rank": rank, "world": world}


def train_cli(args) -> int:
    try:
        allowed = [k.strip() for item in getattr(args, "allow_config_change", None) or [] for k in item.split(",")
                   if k.strip()]
        if allowed and not args.resume:
            raise ConfigError("--allow-config-change goes with --resume RUN_DIR")
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
            cfg = load_config(args.config, args.overrides)
        else:
            raise ConfigError("memr1 train needs --config FILE or --resume RUN_DIR")
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
        out = train(cfg)
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
