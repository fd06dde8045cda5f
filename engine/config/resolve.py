"""One config resolution: everything derived from the run config is computed here, once, from the
fields the user set, and nothing downstream overwrites a user field.

Derived: the run directory; the base model's folder; the ranks; the task (the agents' settings, one
record for training and evaluation); each stage's learner config (its algorithm preset, its role's
token horizon), start weights and per-rank prompts; the rollout sampling of each role; the run seed,
which feeds every RNG (items order, each engine's sampler, the learner); and the problems a plan must
show (prompts that do not divide over the ranks, budgets that can cut a distillation).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import msgspec

from memr1.engine.config.errors import ConfigError
from memr1.engine.config.run import RunConfig
from memr1.engine.config.stages import stage_config, stage_name
from memr1.engine.training.config import LearnerConfig
from memr1.rl.task.agents.answer import reply_bound
from memr1.rl.algos.config import dr_grpo
from memr1.rl.generation import SamplingConfig
from memr1.rl.task.stages.calls import StageConfig
from memr1.rl.task.turns import Task


@dataclass(frozen=True)
class Resolved:
    cfg: RunConfig
    run_dir: Path
    base_model: Path | None     # None only when planning for a model that is not on this machine
    rank: int
    world: int
    task: Task                  # cfg's extract, manager and answer settings, built once per run

    @property
    def seed(self) -> int:
        return self.cfg.seed

    def stage(self, name: str) -> StageConfig:
        return stage_config(self.cfg, name)

    def max_new_tokens(self, role: str) -> int:
        return self.task.manager.max_new_tokens if role == "manager" else self.task.answer.max_new_tokens

    def rollout_sampling(self, role: str) -> SamplingConfig:
        r = self.cfg.rollout
        return SamplingConfig(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                              max_new_tokens=self.max_new_tokens(role))

    def learner(self, name: str) -> LearnerConfig:
        """The learner config of a stage. Warm and control stages train scripted replies: no KL, no
        critic, no entropy bonus. dr_grpo is GRPO with std "none" and a token sum over the role's budget."""
        cfg = self.cfg.learner
        if stage_name(name).supervised:
            return msgspec.structs.replace(cfg, algo="grpo", loss=msgspec.structs.replace(
                cfg.loss, kl_coef=0.0, entropy_coef=0.0, aggregation="token-mean"))
        if cfg.algo == "dr_grpo":
            grpo, loss = dr_grpo(self.max_new_tokens(stage_name(name).role), cfg.loss)
            return msgspec.structs.replace(cfg, grpo=msgspec.structs.replace(cfg.grpo, std=grpo.std), loss=loss)
        return cfg

    def temperature(self, name: str) -> float:
        """The temperature the learner's log-probs are taken at: the one the stage sampled with (a warm
        stage samples nothing; its replies are scored under the plain distribution)."""
        return 1.0 if stage_name(name).supervised else (self.cfg.rollout.temperature or 1.0)


def world_problem(prompts_per_step: int, world: int, name: str = "") -> str | None:
    """Why `world` data-parallel ranks can't share a stage's prompts (each rolls out whole groups)."""
    if prompts_per_step % world:
        return (f"stage.{name or '<stage>'}.prompts_per_step={prompts_per_step} does not divide over {world} "
                f"data-parallel ranks (torchrun --nproc_per_node); use a multiple of {world}")
    return None


def problems(cfg: RunConfig, world: int) -> list[str]:
    """What stops this config from running as planned: prompts that do not divide over the ranks."""
    return [p for name in cfg.stages if (p := world_problem(stage_config(cfg, name).prompts_per_step, world, name))]


def budget_warnings(cfg: RunConfig) -> list[str]:
    """Token budgets that can cut the answer agent's reply: a one-memory distillation (or, without
    distillation, a short answer) must fit."""
    need = reply_bound(cfg.answer)
    if cfg.answer.max_new_tokens < need:
        fix = (f" (answer.max_memory_bytes={cfg.answer.max_memory_bytes}); raise it or lower max_memory_bytes"
               if cfg.answer.distill else "; raise it")
        return [f"answer.max_new_tokens={cfg.answer.max_new_tokens} can cut a well-formed reply, which "
                f"takes up to {need} tokens{fix}"]
    return []


def env_world() -> int:
    """The number of ranks torchrun set in WORLD_SIZE (1 when unset). Anything but a positive integer
    is a ConfigError: 0 or a negative count would divide the memory estimate by it."""
    raw = os.environ.get("WORLD_SIZE", "1")
    if not re.fullmatch(r"[0-9]{1,6}", raw.strip()) or int(raw) < 1:
        raise ConfigError(f"WORLD_SIZE={raw!r}: must be a positive number of ranks (torchrun sets it)")
    return int(raw)


def resolve(cfg: RunConfig, rank: int = 0, world: int | None = None, need_model: bool = True,
            trains: bool = True) -> Resolved:
    """The derived run. Raises ValueError on a problem (see `problems`). `trains`: False for commands that
    only generate (rollout, eval), which never read the learner's settings."""
    from memr1.engine.generation import resolve_model

    world = world if world is not None else env_world()
    if found := problems(cfg, world):
        raise ValueError(found[0])
    try:
        base = resolve_model(cfg.generator.model)
    except ValueError:
        if need_model:
            raise
        base = None
    if trains and base is not None and (problem := layers_problem(cfg, Path(base))):
        raise ValueError(problem)
    return Resolved(cfg, cfg.resolved_run_dir(), base, rank, world, Task(cfg.extract, cfg.manager, cfg.answer))


def layers_problem(cfg: RunConfig, model: Path) -> str | None:
    """learner.train_layers against the model's decoder blocks (its config.json), before any engine
    starts: a recipe sized for one model run on a smaller one fails here in one line."""
    n = cfg.learner.train_layers
    try:
        blocks = json.loads((model / "config.json").read_text()).get("num_hidden_layers") if n else None
    except (OSError, ValueError, AttributeError):
        return None   # the model's own loading says what is wrong with its folder
    if isinstance(blocks, int) and n > blocks:
        return (f"learner.train_layers={n}: the model {model} has {blocks} decoder blocks; use at most {blocks}, "
                f"or 0 to train every weight")
    return None

