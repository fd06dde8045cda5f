"""The run config: one msgspec Struct composed of the component configs, read from TOML with dotted
`key=value` overrides, and written back as TOML into the run dir (toml_out.py).

Each component keeps its config next to its code, in a module that imports no torch (GeneratorConfig
in engine/generation/config.py, LearnerConfig in engine/training/config.py, ManagerConfig in
rl/task/agents, EvalConfig in rl/task/eval/evaluation, ...), so reading a config costs no torch import; this file only
composes them, with the run-level settings that belong to no component folder (data, banks, rollout
sampling, the loop). Unknown keys are errors at every depth, with the dotted key and the file named, so
a typo never silently falls back to a default.
"""
import os
import re
import tempfile
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from memr1.engine.checkpoints.files import CheckpointConfig
from memr1.engine.config.errors import ConfigError, check_keys, validation_message
from memr1.engine.config.stages import STAGES, StagesConfig, stage_name
from memr1.engine.generation.config import GeneratorConfig
from memr1.engine.observe.profiling import ProfileConfig
from memr1.engine.training.config import LearnerConfig
from memr1.rl.task.agents.answer import AnswerConfig
from memr1.rl.task.agents.extract import ExtractConfig
from memr1.rl.task.agents.manager import ManagerConfig
from memr1.rl.task.eval.evaluation import EvalConfig
from memr1.rl.task.episodes import EpisodeConfig
from memr1.rl.task.train_items import ItemsConfig
from memr1.rl.task.eval.judging import JudgeConfig
from memr1.rl.task.rewards import RewardConfig


class DataConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    path: str | None = None   # a LoCoMo / LongMemEval / MSC file; None (or "") = the built-in synthetic set
    n: Annotated[int, Meta(ge=1, le=10_000)] = 20  # synthetic conversations (of every 10: 8 train, 1 val, 1 test)
    # the synthetic set's seed: another seed is another whole set (train, val and test alike), with its own
    # sample ids (synth-<seed>-<index>), so caches keyed by sample id never mix sets; ignored when `path` is given
    seed: Annotated[int, Meta(ge=0, le=2**31 - 1)] = 0
    # which built-in set (ignored when `path` is given): "synthetic" (rl/task/data/synthetic.py) or "budget",
    # the budgeted task of rl/task/data/budget.py (configs/budget.toml)
    kind: Literal["synthetic", "budget"] = "synthetic"


class BankSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    fsync: Literal["never", "op", "every_n", "close"] = "close"  # memory_store BankConfig.fsync for banks on disk
    hash_dim: Annotated[int, Meta(ge=1, le=65_536)] = 256   # vector size when embedder = "hash"


class RolloutConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """How RL stages sample (evaluation and the frozen roles are greedy). Each role's token budget is
    its own `max_new_tokens`, the same as in evaluation."""
    temperature: Annotated[float, Meta(ge=0, le=100)] = 1.0    # 0: greedy
    top_p: Annotated[float, Meta(gt=0, le=1)] = 1.0
    top_k: Annotated[int, Meta(ge=-1, le=1 << 20)] = -1           # -1: off; 0 is refused in `check`
    # Dynamic sampling (rl/task/stages/calls.py): drop groups whose completions all scored the same and roll out more
    # items until the step holds prompts_per_step informative groups, drawing at most refill_max_prompts
    # extra items a step (0: as many as prompts_per_step). Call-level RL stages and their rs controls.
    refill: bool = False
    refill_max_prompts: Annotated[int, Meta(ge=0, le=1_000_000)] = 0
    # Train on rollouts `memr1 rollout` recorded in these folders instead of generating (engine/replay.py;
    # `memr1 train --from-rollouts DIR ...` sets it): the run trains the stage they were written for.
    replay: tuple[str, ...] = ()


class LoopConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How engine/loop.py runs a stage. Here, not in loop.py, because the loop imports torch (weight syncs)."""
    max_staleness: Annotated[int, Meta(ge=0, le=1000)] = 0   # 0: synchronous; k: rollouts may run k weight versions ahead
    sync_every: Annotated[int, Meta(ge=1, le=1_000_000)] = 1      # push weights to the generator every n learner steps
    on_rollout_error: Literal["stop", "skip"] = "stop"
    max_skipped: Annotated[int, Meta(ge=0, le=1_000_000)] = 8     # with "skip": stop once this many rollouts failed
    # Also at the end, on SIGINT/SIGTERM and when a rollout error stops the stage; 0: only then. A
    # kill -9 loses at most this many steps; checkpoint.keep_last bounds the disk they take.
    checkpoint_every: Annotated[int, Meta(ge=0, le=1_000_000)] = 10
    validate_every: Annotated[int, Meta(ge=0, le=1_000_000)] = 0  # validate (greedy, on the val split) every n steps and at the end; 0: never
    validate_stages: list[str] = []   # the RL stages that validate (each hands on its best checkpoint); empty: every one
    # Also score each phase's starting weights before its first step (verl's val_before_train), so a
    # phase whose checkpoints all score below where it began hands its start on; one more validation a phase.
    validate_start: bool = False
    # The probe curve: every n steps (and before the first), the policy's greedy reward on the last
    # `probe_items` train items of each RL stage (and its controls), held out of training, so a user
    # sees whether the policy improves or only its batches got easier. 0: never.
    probe_every: Annotated[int, Meta(ge=0, le=1_000_000)] = 0
    probe_items: Annotated[int, Meta(ge=1, le=1_000_000)] = 64
    # GPU, when generation and training don't fit together: the generator sleeps (vLLM sleep mode)
    # through each learner step and wakes before the weight sync. Needs max_staleness = 0, since a
    # sleeping engine can't roll out the next step meanwhile. A no-op on CPU backends.
    sleep_while_training: bool = False


class RunConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str = "default"
    seed: Annotated[int, Meta(ge=0, le=2**31 - 1)] = 0   # the one run seed: item order, sampling, the learner's RNG (each rank offsets it)
    run_dir: str = ""         # "" = runs/<name>
    cache_dir: str = ""       # extractions and eval banks; "" = $MEMR1_CACHE/eval, else <run_dir>/cache
    embedder: str = "minilm"  # "minilm" (all-MiniLM-L6-v2, 384-d) | "hash" (tests)
    # the task, shared by training and evaluation
    extract: ExtractConfig = msgspec.field(default_factory=ExtractConfig)
    manager: ManagerConfig = msgspec.field(default_factory=ManagerConfig)
    answer: AnswerConfig = msgspec.field(default_factory=AnswerConfig)
    reward: RewardConfig = msgspec.field(default_factory=RewardConfig)
    judge: JudgeConfig = msgspec.field(default_factory=JudgeConfig)
    data: DataConfig = msgspec.field(default_factory=DataConfig)
    bank: BankSettings = msgspec.field(default_factory=BankSettings)
    generator: GeneratorConfig = msgspec.field(default_factory=GeneratorConfig)
    # training (memr1 train)
    stages: list[str] = msgspec.field(default_factory=lambda: ["manager", "answer"])
    stage: StagesConfig = msgspec.field(default_factory=StagesConfig)
    items: ItemsConfig = msgspec.field(default_factory=ItemsConfig)
    episode: EpisodeConfig = msgspec.field(default_factory=EpisodeConfig)   # the manager_episode stage
    rollout: RolloutConfig = msgspec.field(default_factory=RolloutConfig)
    learner: LearnerConfig = msgspec.field(default_factory=LearnerConfig)
    loop: LoopConfig = msgspec.field(default_factory=LoopConfig)
    checkpoint: CheckpointConfig = msgspec.field(default_factory=CheckpointConfig)
    profile: ProfileConfig = msgspec.field(default_factory=ProfileConfig)   # torch.profiler traces of chosen steps
    eval_after: list[str] = []   # after training, `memr1 eval` of "base", "warm", "trained", "control", "rs" (and
                                 # "add_all": the trained answer agent on ADD-every-fact banks) on eval_split
    eval_split: str = "val"
    # evaluation (memr1 eval, and eval_after)
    eval: EvalConfig = msgspec.field(default_factory=EvalConfig)

    def resolved_run_dir(self) -> Path:
        path = Path(self.run_dir or f"runs/{self.name}")
        if path.exists() and not path.is_dir():  # train and eval write into it
            raise ConfigError(f"run_dir {path} exists and is not a folder")
        return path


def make_run_dir(path: Path) -> Path:
    """Create the run folder and check a file can be written there (a folder under a file, or in
    /proc, cannot hold one), so a bad run_dir is one error line before anything starts."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise ConfigError(f"run_dir {path}: cannot write there ({e.strerror or e})") from None
    return path


def check_writable(path: Path, key: str) -> None:
    """What make_run_dir would find, without creating anything: `path` is a folder, or the nearest folder
    above it is one this process may write in, outside /proc and /sys (which no run can write to)."""
    path = Path(path).absolute()
    if any(path == p or p in path.parents for p in (Path("/proc"), Path("/sys"))):
        raise ConfigError(f"{key} {path}: cannot write there (a kernel file system)")
    top = path
    while not top.exists() and not top.is_symlink():
        top = top.parent
    if not top.is_dir():
        raise ConfigError(f"{key} {path}: {top} is not a folder" if top != path else f"{key} {path} exists and is not a folder")
    if not os.access(top, os.W_OK | os.X_OK):
        raise ConfigError(f"{key} {path}: cannot write in {top}")


EMBEDDERS = ("minilm", "hash")


def make_embedder(cfg: RunConfig):
    """The run's text embedder: all-MiniLM-L6-v2, or the hashing embedder of the tests; each distinct
    text is embedded once per run."""
    from memr1.memory_store import CachedEmbedder, HashEmbedder, default_embedder

    return CachedEmbedder(HashEmbedder(cfg.bank.hash_dim) if cfg.embedder == "hash" else default_embedder())


# ---- loading ----
def load_config(path: str | Path | None, overrides: list[str] = ()) -> RunConfig:
    """TOML file (None = all defaults) plus `a.b.c=value` overrides -> a checked RunConfig."""
    where = str(path) if path is not None else "<defaults>"
    raw: dict = {}
    if path is not None:
        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"config file {path} is a directory, not a TOML file")
        if not path.exists():
            raise ConfigError(f"config file {path} does not exist")
        if not path.is_file():   # /dev/zero, a FIFO: reading it would never end
            raise ConfigError(f"config file {path} is not a regular file")
        try:
            raw = tomllib.loads(path.read_text())
        except ValueError as e:   # TOMLDecodeError, UnicodeDecodeError, an integer of 5,000 digits
            raise ConfigError(f"{path}: not valid TOML ({e})") from None
        except RecursionError:
            raise ConfigError(f"{path}: not valid TOML (nested too deeply)") from None
    check_keys(raw, RunConfig, where)
    by_key = {}   # dotted key -> the override that set it, so an error blames the override
    for item in overrides or []:
        key, value = parse_override(item)
        by_key[key] = f"override {item!r}"
        check_keys(set_dotted({}, key, value, item), RunConfig, by_key[key])
        set_dotted(raw, key, value, item)
    check_keys(raw, RunConfig, f"{where} + overrides")
    stage_defaults(raw)
    try:
        cfg = msgspec.convert(raw, RunConfig)
    except msgspec.ValidationError as e:
        raise ConfigError(validation_message(e, raw, RunConfig, where, by_key)) from None
    except ValueError as e:   # a component config's own check (__post_init__)
        raise ConfigError(f"{where}: {e}") from None
    check(cfg, where, by_key)
    return cfg


def stage_defaults(raw: dict) -> None:
    """A `[stage.<name>]` given in part keeps that stage's own defaults for the rest (a warm start's
    group_size is 1), not the plain StageConfig's, which decoding the section alone would give."""
    given = raw.get("stage")
    if not isinstance(given, dict):
        return
    defaults = msgspec.to_builtins(StagesConfig())
    for name, section in given.items():
        if isinstance(section, dict) and isinstance(defaults.get(name), dict):
            given[name] = {**defaults[name], **section}


def parse_override(item: str) -> tuple[str, Any]:
    if not isinstance(item, str) or "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value (e.g. eval.baseline=rag)")
    key, text = item.split("=", 1)
    key = key.strip()
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", key):
        raise ConfigError(f"override {item!r}: {key!r} is not a dotted key like section.name")
    try:   # a TOML literal (3, 0.5, true, "x", [1, 2]); anything else is taken as a plain string
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text
    except ValueError as e:   # a TOML literal Python refuses: an integer of 5,000 digits
        raise ConfigError(f"override {item[:80]!r}: {e}") from None
    except RecursionError:
        raise ConfigError(f"override {item!r}: the value is nested too deeply") from None
    return key, value


def set_dotted(raw: dict, key: str, value, item: str) -> dict:
    node = raw
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: {'.'.join(parts[:i + 1])} is a value, not a section")
    node[parts[-1]] = value
    return raw


def check(cfg: RunConfig, where: str, by_key: dict | None = None) -> None:
    """Checks across fields and of values a Meta range cannot say. `by_key`: key -> the override
    that set it (named instead of the file)."""
    at = lambda key: (by_key or {}).get(key, where)   # noqa: E731
    if cfg.embedder not in EMBEDDERS:
        raise ConfigError(f"{at('embedder')}: embedder must be one of {EMBEDDERS}, got {cfg.embedder!r}")
    if not cfg.name.strip() or re.search(r"[/\\\x00-\x1f\x7f]", cfg.name) or cfg.name.strip(".") == "":
        raise ConfigError(f"{at('name')}: name must be a folder name (not blank, no '/' or control "
                          f"characters, not dots only), got {cfg.name!r}")
    for key in ("name", "run_dir", "cache_dir"):
        if "\x00" in getattr(cfg, key):   # no path can hold one
            raise ConfigError(f"{at(key)}: {key} holds a NUL byte: {getattr(cfg, key)!r}")
        try:   # bytes that are not UTF-8 arrive from argv as lone surrogates; config.toml could not hold them
            getattr(cfg, key).encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"{at(key)}: {key} is not valid UTF-8: {ascii(getattr(cfg, key))}") from None
    if cfg.rollout.top_k == 0:
        raise ConfigError(f"{at('rollout.top_k')}: rollout.top_k = 0: must be -1 (off) or >= 1")
    unknown = [s for s in cfg.stages if s not in STAGES]
    if unknown:
        raise ConfigError(f"{where}: stages: unknown stage(s) {unknown}; use {', '.join(STAGES)}")
    for name in cfg.stages:
        warm = stage_name(name).of("warm")
        if stage_name(name).baseline and (warm not in cfg.stages or cfg.stages.index(warm) > cfg.stages.index(name)):
            raise ConfigError(f"{where}: stages: {name} continues {warm}'s checkpoint; list {warm} before it")
    bad = [n for n in cfg.loop.validate_stages if n not in cfg.stages or stage_name(n).supervised]
    if bad:
        raise ConfigError(f"{at('loop.validate_stages')}: loop.validate_stages: {bad} is not an RL stage of this run "
                          f"(stages: {', '.join(cfg.stages)}); supervised stages never validate")
    if cfg.loop.validate_start and not cfg.loop.validate_every:
        raise ConfigError(f"{at('loop.validate_start')}: loop.validate_start scores each phase's start for "
                          f"loop.validate_every's choice of checkpoint; set loop.validate_every too")
    bad = [w for w in cfg.eval_after if w not in ("base", "warm", "trained", "control", "rs", "add_all")]
    if bad:
        raise ConfigError(f"{where}: eval_after: unknown {bad}; use 'base', 'warm', 'trained', 'control', 'rs' "
                          f"and/or 'add_all'")
    if cfg.eval_split not in ("train", "val", "test"):
        raise ConfigError(f"{where}: eval_split must be train, val or test, got {cfg.eval_split!r}")
    for key in ("frozen_answer", "bank_manager"):
        value = getattr(cfg.stage, key)
        if value not in ("latest", "base") and not (Path(value) / "config.json").is_file():
            raise ConfigError(f"{where}: stage.{key}={value!r}: use latest, base, or an HF checkpoint folder "
                              f"(no config.json there)")
    for name in STAGES:   # in the order the check always had: manager_warm, then answer_warm
        if stage_name(name).kind == "warm" and name in cfg.stages and getattr(cfg.stage, name).group_size != 1:
            raise ConfigError(f"{where}: stage.{name}.group_size must be 1: a warm start trains one scripted "
                              f"reply per prompt")
    if cfg.stage.manager_warm.banks != "oracle":
        raise ConfigError(f"{at('stage.manager_warm.banks')}: stage.manager_warm.banks: only answer_warm reads "
                          f"banks of a choice; the manager's warm start always sees the oracle's")
    if cfg.stage.answer_warm.banks == "mix" and cfg.stage.answer_warm.pool_seed is not None:
        raise ConfigError(f"{at('stage.answer_warm.banks')}: stage.answer_warm.banks = 'mix' reads the run's own "
                          f"train split; a format start's pool (pool_seed) has the oracle's banks only")
    if cfg.reward.kind == "judge" and cfg.judge.kind == "off":
        raise ConfigError(f"{where}: reward.kind = 'judge' needs judge.kind = 'local' or 'openai'")
