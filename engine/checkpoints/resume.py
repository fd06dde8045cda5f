"""What a resumed run checks and cuts back before it trains.

Config: `memr1 train --resume RUN_DIR [overrides]` compares the run's config.toml with the effective
config (overrides applied) key by key and refuses any change unless `--allow-config-change` names the
key (or a section above it, e.g. `stage.manager`). A change the checkpoints cannot follow is refused
even then. `profile.*` may change freely: it traces steps and changes nothing that is trained.

Checkpoints and logs: each stage resumes from its newest checkpoint that verifies (falling back past
damaged ones, see files.py), and metrics.jsonl keeps, of each stage, only the lines up to
that checkpoint's step (none for a stage without one), so a step trained again is logged once.
"""
from __future__ import annotations

import json
from pathlib import Path

import msgspec

from memr1.engine.checkpoints.files import usable_checkpoint
from memr1.engine.config.errors import ConfigError
from memr1.engine.config.run import RunConfig
from memr1.engine.observe.runlog import truncate_metrics

FREE = ("profile",)
FIXED = {"learner.algo": "the checkpoints hold this algorithm's optimizer (and critic) state",
         "generator.model": "the checkpoints are of this model"}


def flatten(value, prefix: str = "") -> dict:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: value}


def _under(key: str, names) -> bool:
    return any(key == n or key.startswith(n + ".") for n in names)


def config_changes(stored: RunConfig, effective: RunConfig) -> dict[str, tuple]:
    """dotted key -> (stored value, effective value), for every key that differs (profile.* aside)."""
    old, new = flatten(msgspec.to_builtins(stored)), flatten(msgspec.to_builtins(effective))
    return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new))
            if old.get(k) != new.get(k) and not _under(k, FREE)}


def check_resume_config(run_dir: str, stored: RunConfig, effective: RunConfig, allowed: list[str]) -> None:
    """ConfigError unless every change from the stored config is in `allowed` (keys or sections)."""
    known = flatten(msgspec.to_builtins(stored))
    unknown = [a for a in allowed if not any(_under(k, [a]) for k in known)]
    if unknown:
        raise ConfigError(f"--allow-config-change: no config key {', '.join(map(repr, unknown))}")
    changes = config_changes(stored, effective)
    fixed = [f"{k} ({why})" for k, why in FIXED.items() if k in changes]
    if fixed:
        raise ConfigError(f"--resume {run_dir}: {'; '.join(fixed)} cannot change on resume; start a new run")
    refused = {k: v for k, v in changes.items() if not _under(k, allowed)}
    if refused:
        lines = "".join(f"\n  {k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
        raise ConfigError(f"--resume {run_dir}: the config differs from the run's config.toml in {len(refused)} "
                          f"key(s); pass --allow-config-change {','.join(refused)} to accept:{lines}")


def state_step(ckpt: Path | None) -> int:
    return int(json.loads((ckpt / "state.json").read_text())["step"]) if ckpt is not None else 0


def resume_points(run_dir: Path, stages: list[str], rank: int, say) -> dict[str, Path | None]:
    """stage -> the checkpoint it resumes from (None: it starts fresh). Rank 0 cuts metrics.jsonl back
    to these steps. Raises CheckpointError when a stage has checkpoints and none of them verifies."""
    points = {name: usable_checkpoint(run_dir / name, say) for name in stages}
    if rank == 0:
        dropped = truncate_metrics(run_dir, {name: state_step(p) for name, p in points.items()})
        if dropped:
            say(f"metrics.jsonl: dropped {dropped} line(s) past the checkpoints; those steps run again")
    return points
