"""Checkpoints: `checkpoints/step_<N>/` that transformers and vLLM load directly, plus training state.

Layout of one checkpoint, a self-contained HF model folder (`from_pretrained`, vLLM and
`AutoTokenizer` all load it):
  config.json, model.safetensors    the policy, gathered to full tensors (HF names, tied weights once)
  tokenizer files, chat template,   copied from the model the stage started from
  generation_config.json
  optimizer.pt, scheduler.pt        full (unsharded) optimizer state keyed by parameter name, so a run
                                    can resume on another world size; critic*.pt likewise for PPO
  rng_rank<R>.pt                    torch / python / numpy (/ cuda) generator states of each rank
  state.json                        the loop's step, weight version, the caller's data cursor
  manifest.json                     every file's size and SHA-256, written last (checkpoint_files.py)
Every .pt file holds tensors and plain containers only and is read with `weights_only=True`, so a
crafted checkpoint cannot run code on resume.

It is written into `step_<N>.tmp` and renamed at the end: a kill mid-save leaves earlier checkpoints
intact and never a half-written `step_<N>`. N is the loop's step (a skipped rollout trains nothing,
so the learner's own step count can lag behind it).
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)

from memr1.engine.checkpoint_files import CheckpointError, best_step, newest_whole, verify, write_manifest

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
FULL_LOAD = StateDictOptions(full_state_dict=True)
# The fields that make two checkpoints the same network; anything else (dtype, attention) may differ.
SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "vocab_size", "tie_word_embeddings")


def latest_checkpoint(stage_dir) -> Path | None:
    """The highest `checkpoints/step_<N>` of a stage folder, or None."""
    steps = sorted((int(p.name.split("_")[1]), p) for p in (Path(stage_dir) / "checkpoints").glob("step_*")
                   if p.name.split("_")[1].isdigit())
    return steps[-1][1] if steps else None


# Files of a model folder, besides its weights and config.json, that make it loadable on its own.
MODEL_FILES = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.*", "merges.txt",
               "*.jinja", "chat_template.json", "generation_config.json")


def final_checkpoint(stage_dir) -> Path | None:
    """The checkpoint a stage hands on: the best one by validation (best.json) when the stage
    validated, else its latest; either only with all its files there."""
    best = best_step(stage_dir)
    if best is not None:
        path = Path(stage_dir) / "checkpoints" / f"step_{best}"
        if verify(path, checksums=False) is None:
            return path
    return newest_whole(stage_dir)


def final_checkpoints(run_dir, stages: list[str]) -> dict[str, Path]:
    """role ("manager" / "answer") -> the final checkpoint of its last stage in `stages` that has one
    (a "<role>_control" stage is a control beside the policy, never the role's policy)."""
    from memr1.engine.config import stage_name   # the config imports the learner, which imports this module
    out = {}
    for name in stages:
        if stage_name(name).kind != "control" and (ckpt := final_checkpoint(Path(run_dir) / name)) is not None:
            out[stage_name(name).role] = ckpt
    return out


def _rng_state() -> dict:
    """Every generator's state as tensors and plain lists (loadable with weights_only=True)."""
    version, mt, gauss = random.getstate()
    kind, key, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": [version, list(mt), gauss],
             "numpy": [kind, torch.from_numpy(key.astype(np.int64)), int(pos), int(has_gauss), float(cached)]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict):
    torch.set_rng_state(state["torch"])
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    kind, key, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, key.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _load(path: str):
    return torch.load(path, weights_only=True)


def copy_model_files(src: str, dst: str) -> None:
    """Tokenizer, chat template and generation config of model folder `src`, into `dst`."""
    for pattern in MODEL_FILES:
        for f in Path(src).glob(pattern):
            if f.is_file():
                shutil.copy2(f, os.path.join(dst, f.name))


def _hf_state_dict(model) -> dict:
    """Full policy weights with HF names (the learner wraps the LM as `lm.`); tied lm_head dropped."""
    sd = get_model_state_dict(model, options=FULL)
    sd = {k.removeprefix("lm."): v.contiguous() for k, v in sd.items()}
    if getattr(model.lm.config, "tie_word_embeddings", False):
        sd.pop("lm_head.weight", None)
    return sd


def save(learner, stage_dir: str, step: int, data_state: dict, model_dir: str = "") -> str:
    """Write `stage_dir/checkpoints/step_<step>/`; `model_dir` lends its tokenizer and generation files."""
    d = learner.d
    final = os.path.join(stage_dir, "checkpoints", f"step_{step}")
    tmp = final + ".tmp"
    if d.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    d.barrier()
    # Gathers are collectives: every rank calls them; rank 0 alone writes.
    model_sd = _hf_state_dict(learner.policy)
    optim_sd = get_optimizer_state_dict(learner.policy, learner.optim, options=FULL)
    critic = None
    if learner.critic is not None:
        critic = (get_model_state_dict(learner.critic, options=FULL),
                  get_optimizer_state_dict(learner.critic, learner.critic_optim, options=FULL))
    torch.save(_rng_state(), os.path.join(tmp, f"rng_rank{d.rank}.pt"))
    if d.rank == 0:
        learner.hf_config.save_pretrained(tmp)
        if model_dir:
            copy_model_files(model_dir, tmp)
        save_file(model_sd, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        torch.save(optim_sd, os.path.join(tmp, "optimizer.pt"))
        torch.save(learner.sched.state_dict(), os.path.join(tmp, "scheduler.pt"))
        if critic is not None:
            torch.save({"model": critic[0], "optim": critic[1], "sched": learner.critic_sched.state_dict()},
                       os.path.join(tmp, "critic.pt"))
        with open(os.path.join(tmp, "state.json"), "w") as f:
            json.dump({"step": step, "learner_step": learner.step, "weight_version": learner.version,
                       "world_size": d.world, "data": data_state}, f)
    d.barrier()
    if d.rank == 0:
        write_manifest(tmp, step)   # last, so it lists every rank's files
        if os.path.exists(final):  # re-saving the same step: swap, then drop the old copy
            shutil.rmtree(final + ".old", ignore_errors=True)
            os.rename(final, final + ".old")
        os.rename(tmp, final)
        shutil.rmtree(final + ".old", ignore_errors=True)
    d.barrier()
    return final


def _use_lr(optim, sched, lr: float) -> None:
    """The stage's configured rate wins over the checkpoint's (a resume allowed to change the lr
    changes it): the schedule's base rates and the current rates are scaled alike."""
    base = sched.base_lrs[0] if sched.base_lrs else lr
    if not base or lr == base:
        return
    factor = lr / base
    sched.base_lrs = [b * factor for b in sched.base_lrs]
    for group in optim.param_groups:
        group["lr"] *= factor
        if "initial_lr" in group:
            group["initial_lr"] *= factor
    sched._last_lr = [group["lr"] for group in optim.param_groups]


def check_compatible(path: str, hf_config):
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise ValueError(f"{path} is not a checkpoint: it has no config.json")
    with open(cfg_path) as f:
        saved = json.load(f)
    ours = hf_config.to_dict()
    diff = [f"{k}: checkpoint {saved.get(k)!r} vs model {ours.get(k)!r}" for k in SHAPE_KEYS
            if saved.get(k) != ours.get(k)]
    if diff:
        raise ValueError(f"checkpoint {path} is from a different model: " + "; ".join(diff))


def load(learner, path: str) -> dict:
    """Restore everything `save` wrote into an already built learner; returns the data cursor."""
    check_compatible(path, learner.hf_config)
    sd = load_file(os.path.join(path, "model.safetensors"))
    ours = dict(learner.policy.lm.named_parameters())
    if getattr(learner.hf_config, "tie_word_embeddings", False):
        sd.setdefault("lm_head.weight", sd.get("model.embed_tokens.weight"))
    missing = [k for k in learner.policy.lm.state_dict() if k not in sd and k in ours]
    wrong = [k for k, v in sd.items() if k in ours and tuple(v.shape) != tuple(ours[k].shape)]
    if missing or wrong:
        raise ValueError(f"checkpoint {path} does not match the model: missing {missing[:5]}, "
                         f"wrong shape {wrong[:5]}")
    set_model_state_dict(learner.policy, {"lm." + k: v for k, v in sd.items()}, options=FULL_LOAD)
    osd = _load(os.path.join(path, "optimizer.pt"))
    set_optimizer_state_dict(learner.policy, learner.optim, osd, options=FULL_LOAD)
    learner.sched.load_state_dict(_load(os.path.join(path, "scheduler.pt")))
    _use_lr(learner.optim, learner.sched, learner.lr)
    if learner.critic is not None:
        if not os.path.exists(os.path.join(path, "critic.pt")):
            raise ValueError(f"checkpoint {path} has no critic.pt: it was not written by a PPO run")
        c = _load(os.path.join(path, "critic.pt"))
        set_model_state_dict(learner.critic, c["model"], options=FULL_LOAD)
        set_optimizer_state_dict(learner.critic, learner.critic_optim, c["optim"], options=FULL_LOAD)
        learner.critic_sched.load_state_dict(c["sched"])
    with open(os.path.join(path, "state.json")) as f:
        state = json.load(f)
    rng = os.path.join(path, f"rng_rank{learner.d.rank}.pt")
    if os.path.exists(rng):
        _set_rng_state(_load(rng))
    elif learner.d.rank < int(state.get("world_size", 1)):   # a rank the run never had starts fresh streams
        raise CheckpointError(f"checkpoint {path} has no rng_rank{learner.d.rank}.pt, which its run wrote")
    learner.step, learner.version = state["learner_step"], state["weight_version"]
    return state
