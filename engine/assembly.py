"""A run, assembled once: what `memr1 train`, `memr1 rollout` and `memr1 eval` build from a resolved
config, so the commands share it here and never import each other.

  RunContext      the resolved run, its embedder, its two engines (the policy being trained, and one
                  whose weights swap between roles), the items of its split (and of val, when a stage
                  validates), the judge
  make_stage      a stage of the loop from the context, the stage's name and the checkpoints the run
                  has handed on (`latest`); its settings come from the config through the name
  check_data      a run with nothing to train or validate on stops before any engine starts
  cli_models      the checkpoints --checkpoint / --manager / --answer name (memr1 eval, memr1 rollout)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec

from memr1.engine.config.judge import make_judge
from memr1.engine.config.resolve import Resolved
from memr1.engine.config.run import RunConfig, load_config, make_embedder
from memr1.engine.config.stages import stage_name
from memr1.rl.generation import GREEDY


@dataclass
class RunContext:
    run: Resolved
    embedder: object
    policy: object                 # the engine that samples the policy being trained
    swap: object                   # WeightSwap: the frozen answer agent, bank-building managers, the judge
    items: object                  # RunItems of the split the stages draw from
    val_items: object | None = None   # RunItems of the val split, when a stage validates
    replay: object | None = None      # engine/replay.py's Recording: the run trains on recorded rollouts

    @property
    def cfg(self) -> RunConfig:
        return self.run.cfg

    @property
    def tokenizer(self):
        return self.policy.tokenizer

    def judge(self):
        return make_judge(self.run.cfg, self.swap.view(self.run.base_model))

    def close(self) -> None:
        for built in (self.items, self.val_items):
            if built is not None:
                built.close()


def open_context(run: Resolved, split: str = "train", validate: bool = False,
                 policy_model: Path | None = None, replay=None) -> RunContext:
    """Two engines serve the whole run: the policy (from `policy_model` when given, else the base
    model), and one whose weights swap between roles. Under torchrun each rank has its own pair, made
    in the same order (vLLM's creation is collective). `replay`: the run's Recording (engine/replay.py),
    which make_stage turns into the stage to train."""
    from memr1.engine.generation import make_generator
    from memr1.engine.generation.swap import WeightSwap
    from memr1.engine.items import RunItems

    cfg = run.cfg
    embedder = make_embedder(cfg)
    policy = make_generator(cfg.generator, cfg.seed)
    if policy_model is not None:
        WeightSwap(policy, loaded=run.base_model).load(policy_model)
    swap = WeightSwap(make_generator(cfg.generator, cfg.seed), loaded=run.base_model)
    items = RunItems(run, embedder, swap, split)
    val_items = RunItems(run, embedder, swap, "val") if validate else None
    return RunContext(run, embedder, policy, swap, items, val_items, replay)


# ---- stages ----
def pick(setting: str, latest: dict, role: str, base: Path) -> Path:
    """stage.frozen_answer / stage.bank_manager: "latest", "base" or a checkpoint folder."""
    if setting == "latest":
        return latest.get(role, base)
    return base if setting == "base" else Path(setting)


def make_stage(ctx: RunContext, name: str, latest: dict, val: bool = False, probe: bool = False):
    """The stage object for the loop, on the context's items (for validation: greedy, one completion
    per val item, on its val items; `probe`: the same, on the train items `loop.probe_items` holds out
    of training). `latest`: role -> the checkpoint the run's newest stage of that role handed on."""
    from memr1.rl.algos.rejection import RejectionStage
    from memr1.rl.task.hints import Hints
    from memr1.rl.task.stages.calls import AnswerStage, ManagerStage, StageConfig

    run, cfg, n = ctx.run, ctx.cfg, stage_name(name)
    items = ctx.val_items if val else ctx.items
    role, scfg = n.role, run.stage(name)
    bank_manager = pick(cfg.stage.bank_manager, latest, "manager", run.base_model)
    if ctx.replay is not None and not (val or probe):   # recorded rollouts instead of generated ones
        from memr1.engine.replay import ReplayStage
        return ReplayStage(name, ctx.replay.steps, run.rank, run.world)
    if n.scripted:
        return warm_stage(ctx, name, items, bank_manager)
    sampling = run.rollout_sampling(role)
    judge = ctx.judge()
    if n.kind == "episode":
        return episode_stage(ctx, latest, judge, val)
    its = rl_items(items, name, bank_manager, probe)
    if val or probe:  # every item once, greedy; the rank's share when data parallel
        its = its[: len(its) // run.world * run.world]
        scfg = StageConfig(steps=1, prompts_per_step=len(its), group_size=1, lr=scfg.lr)
        sampling = GREEDY.with_tokens(sampling.max_new_tokens)
    refill = 0 if val or probe or not cfg.rollout.refill else \
        max(1, (cfg.rollout.refill_max_prompts or scfg.prompts_per_step) // run.world)   # this rank's share
    if role == "manager":
        frozen = ctx.swap.view(pick(cfg.stage.frozen_answer, latest, "answer", run.base_model))
        hint_n = getattr(scfg, "hints", 0)   # a control's settings carry no hints
        hints = Hints(hint_n, items.by_id, run.task.manager.list_unchanged) if not val and hint_n else None
        stage = ManagerStage(its, frozen, stage_context(ctx, sampling, judge), scfg, hints, refill)
        stage.item_stats = items.manager_stats(name, bank_manager)
    else:
        stage = AnswerStage(its, stage_context(ctx, sampling, judge), scfg, refill)
    return RejectionStage(stage, name) if n.kind == "rs" and not (val or probe) else stage


def warm_stage(ctx: RunContext, name: str, items, bank_manager: Path):
    """A warm start (or format start), or a control on its RL stage's own items: scripted replies."""
    from memr1.rl.task.stages.warm import WarmStage

    run, n = ctx.run, stage_name(name)
    scfg = run.stage(name)
    if n.kind == "warm" and (scfg.pool_seed is not None or scfg.examples):
        its, convs = items.format_pool(n.role, scfg.pool_seed, scfg.examples)
    else:
        its, convs = rl_items(items, n.of("rl") if n.kind == "control" else name, bank_manager), items.by_id
    return WarmStage(n.role, its, convs, stage_context(ctx), ctx.tokenizer, scfg, name)


def episode_stage(ctx: RunContext, latest: dict, judge, val: bool):
    """The manager_episode stage (rl/task/stages/episode.py); for validation: every val window once, one
    greedy episode each, no re-rolls."""
    from memr1.rl.task.stages.episode import EpisodeStage

    run, cfg = ctx.run, ctx.cfg
    scfg, episode = run.stage("manager_episode"), cfg.episode
    sampling = run.rollout_sampling("manager")
    if val:
        scfg = msgspec.structs.replace(scfg, group_size=1)
        sampling = GREEDY.with_tokens(sampling.max_new_tokens)
        episode = msgspec.structs.replace(episode, reroll_prob=0.0)
    items = ctx.val_items if val else ctx.items
    frozen = ctx.swap.view(pick(cfg.stage.frozen_answer, latest, "answer", run.base_model))
    return EpisodeStage(items.episodes, frozen, stage_context(ctx, sampling, judge), scfg, episode, validation=val)


def stage_context(ctx: RunContext, sampling=None, judge=None):
    """What a stage shares with the run (rl/task/stages/context.py), with its role's sampling."""
    from memr1.rl.generation import SamplingConfig
    from memr1.rl.task.stages.context import StageContext

    run = ctx.run
    return StageContext(ctx.embedder, run.task, ctx.cfg.reward, sampling or SamplingConfig(), judge, run.rank,
                        run.world, run.seed)


def rl_items(items, name: str, bank_manager: Path, probe: bool = False) -> list:
    """The items stage `name` trains on (`probe`: the train items `loop.probe_items` holds out of them)."""
    if stage_name(name).role == "manager":
        return items.manager(name, bank_manager, probe)
    return items.answer(name, bank_manager, probe)


# ---- data ----
def check_data(cfg: RunConfig) -> None:
    """Stop a run whose data has nothing to train on, or nothing to validate on when a stage validates,
    before any engine starts."""
    from memr1.engine.validation import validates
    from memr1.rl.task.data import detect_format, load_configured, load_conversations
    from memr1.rl.task.data.locomo import DataError

    validating = [name for name in cfg.stages if validates(cfg, name)]
    if validating and not load_configured(cfg.data, "val"):
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


# ---- the checkpoints a command's flags name ----
def cli_models(args) -> dict[str, Path]:
    """--checkpoint (one HF checkpoint for both trained roles, or a `memr1 train` run directory),
    then --manager / --answer for one role each."""
    from memr1.engine.checkpoints.files import weights_digest

    models = role_models(args.checkpoint) if getattr(args, "checkpoint", None) else {}
    flags = {role: "--checkpoint" for role in models}
    for role in ("manager", "answer"):
        if getattr(args, role, None):
            models[role], flags[role] = checked_model(getattr(args, role), f"--{role}"), f"--{role}"
    for path in {Path(p).resolve(): flags[r] for r, p in models.items()}.items():
        weights_digest(*path)   # CheckpointError before any weight is used: damaged, or not what was saved
    return models


def checked_model(path: str, what: str) -> Path:
    if not (Path(path) / "config.json").is_file():
        raise ValueError(f"{what} {path}: no config.json there (an HF checkpoint folder)")
    return Path(path)


def role_models(checkpoint: str) -> dict[str, Path]:
    """The trained roles of `checkpoint`: one HF checkpoint (both roles), or a `memr1 train` run
    directory (each role's final checkpoint; a role it never trained keeps the base model)."""
    from memr1.engine.checkpoints.io import final_checkpoints

    path = Path(checkpoint)
    if (path / "config.json").is_file():
        return {"manager": path, "answer": path}
    if (path / "config.toml").is_file():
        stages = load_config(path / "config.toml").stages
        found = final_checkpoints(path, stages)
        if not found:
            raise ValueError(f"--checkpoint {path}: a run directory without any checkpoint yet")
        return found
    raise ValueError(f"--checkpoint {path}: no config.json (HF checkpoint) or config.toml (run directory) there")
