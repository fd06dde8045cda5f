"""The stages a run may list, their typed names, and their settings (`[stage.<name>]`).

A stage's name says whose weights it trains and how: "<role>" is RL, "<role>_warm" the supervised warm
start, "<role>_control" the RL stage's supervised control (oracle labels), "<role>_rs" its rejection-sampling
control (no labels: rl/algos/rejection.py), "manager_episode" RL over whole sessions
(rl/task/episodes.py: Memory-R2's episodes, local re-rolls and session curriculum). `stage_name` parses a name, and nothing else
splits one, so a mistyped name fails at config load.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Annotated, Literal, NamedTuple

import msgspec
from msgspec import Meta

from memr1.engine.config.errors import ConfigError
from memr1.rl.task.stages.calls import ManagerRLConfig, StageConfig

if TYPE_CHECKING:
    from memr1.engine.config.run import RunConfig


class ControlConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A supervised control's own settings; its steps and prompts are always its RL stage's."""
    lr: Annotated[float, Meta(gt=0, le=1)] | None = None   # None: the warm start's. A control is a baseline, so
                                                           # it gets its own best lr (tuned on val), not RL's


class WarmConfig(StageConfig, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A warm start's settings: a stage's, plus where its examples come from. With `examples` and
    `pool_seed` it is a *format start* (the outcome-only recipe): at most that many examples from a
    synthetic set of its own seed, disjoint from the run's train, val and test, cycled for the steps."""
    examples: Annotated[int, Meta(ge=0, le=1_000_000)] = 0    # 0: every train item of the run
    pool_seed: Annotated[int, Meta(ge=0, le=2**31 - 1)] | None = None   # None: the run's own train split
    # answer_warm only: the banks its examples read, the oracle's or "mix" (the oracle's and ADD-every-fact
    # banks alternately, items.answer_banks' "mix"), so a supervised reader has seen stale copies
    banks: Literal["oracle", "mix"] = "oracle"


class RSConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A rejection-sampling control's own settings; its steps, prompts and group size are its RL stage's."""
    lr: Annotated[float, Meta(gt=0, le=1)] | None = None   # None: the RL stage's


class StagesConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Per-stage settings; `RunConfig.stages` says which run, in which order."""
    manager: ManagerRLConfig = msgspec.field(default_factory=ManagerRLConfig)
    answer: StageConfig = msgspec.field(default_factory=StageConfig)
    manager_warm: WarmConfig = msgspec.field(default_factory=lambda: WarmConfig(group_size=1, lr=1e-5))
    answer_warm: WarmConfig = msgspec.field(default_factory=lambda: WarmConfig(group_size=1, lr=1e-5))
    # prompts_per_step counts episode items (conversation windows), group_size the episodes of each (G)
    manager_episode: StageConfig = msgspec.field(default_factory=lambda: StageConfig(prompts_per_step=1))
    manager_control: ControlConfig = msgspec.field(default_factory=ControlConfig)
    answer_control: ControlConfig = msgspec.field(default_factory=ControlConfig)
    manager_rs: RSConfig = msgspec.field(default_factory=RSConfig)
    answer_rs: RSConfig = msgspec.field(default_factory=RSConfig)
    # Stage 1's frozen answer agent: "latest" = this run's newest answer-agent checkpoint when one
    # exists (an answer stage ran before the manager's), else the base model; "base"; or a checkpoint.
    frozen_answer: str = "latest"
    # The manager that builds the answer stage's banks when items.answer_banks = "manager": "latest" =
    # this run's newest manager checkpoint, else the base model; "base"; or a checkpoint.
    bank_manager: str = "latest"


# A "<role>_control" stage is the supervised control of that role's RL stage (see `stage_config`).
STAGES = ("manager_warm", "manager", "manager_control", "manager_rs", "manager_episode", "answer_warm", "answer",
          "answer_control", "answer_rs")


class StageName(NamedTuple):
    """A stage's identity, parsed from its name by `stage_name` and nowhere else."""
    role: str    # "manager" | "answer": whose weights it trains
    kind: str    # "rl"; "warm" (the supervised warm start); "control" (the RL stage's supervised control);
                 # "rs" (its rejection-sampling control); "episode" (RL over sessions)

    @property
    def scripted(self) -> bool:
        """It trains scripted oracle replies (a warm start or a control), not sampled ones."""
        return self.kind in ("warm", "control")

    @property
    def supervised(self) -> bool:
        """It trains with the supervised loss (scripted replies, or the best sampled ones), not a reward's
        advantages: no validation, no KL, log-probs at temperature 1."""
        return self.kind in ("warm", "control", "rs")

    @property
    def baseline(self) -> bool:
        """A control beside its RL stage: it starts from the role's warm start and hands on nothing."""
        return self.kind in ("control", "rs")

    def of(self, kind: str) -> str:
        """The name of this role's stage of `kind`."""
        return self.role if kind == "rl" else f"{self.role}_{kind}"


@functools.cache
def stage_name(name: str) -> StageName:
    if name not in STAGES:
        raise ConfigError(f"unknown stage {name!r}; use {', '.join(STAGES)}")
    role, _, kind = name.partition("_")
    return StageName(role, kind or "rl")


def stage_config(cfg: RunConfig, name: str) -> StageConfig:
    """A stage's settings. A control's are derived: the warm start's supervised loss, continued from the
    warm checkpoint for the RL stage's steps on the RL stage's prompts (one reply each), so it sees
    exactly the prompts RL saw, with the oracle's reply instead of a reward; its lr is its own
    (`[stage.<role>_control] lr`) or else the warm start's."""
    n = stage_name(name)
    if n.kind == "rs":   # the RL stage's own rollouts (rl/algos/rejection.py), so only the lr is its own
        rl = getattr(cfg.stage, n.of("rl"))
        lr = getattr(cfg.stage, name).lr or rl.lr
        return StageConfig(steps=rl.steps, prompts_per_step=rl.prompts_per_step, group_size=rl.group_size, lr=lr)
    if n.kind == "control":
        rl, warm = getattr(cfg.stage, n.of("rl")), getattr(cfg.stage, n.of("warm"))
        lr = getattr(cfg.stage, name).lr or warm.lr
        return StageConfig(steps=rl.steps, prompts_per_step=rl.prompts_per_step, group_size=1, lr=lr)
    if n.kind == "episode" and cfg.episode.curriculum:   # the curriculum's phases set the steps
        return msgspec.structs.replace(cfg.stage.manager_episode, steps=sum(p.steps for p in cfg.episode.curriculum))
    return getattr(cfg.stage, name)
