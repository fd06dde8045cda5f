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
  manifest.json                     every file's size and SHA-256, written last (files.py)
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

from memr1.engine.checkpoints.files import (ADAPTER_DIR, ADAPTER_FILES, CheckpointError, best_step, checkpoints, verify,
                                           write_manifest)
from memr1.engine.config.stages import stage_name


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
    validated, else its latest that is whole. Its model files are checked against their SHA-256 here
    (the training state it does not hand on is not read): the next stage loads its weights, and the
    best one may be older than any a resume verified."""
    best = best_step(stage_dir)
    whole = lambda p: verify(p, checksums=True, state=False) is None   # noqa: E731
    if best is not None:
        path = Path(stage_dir) / "checkpoints" / f"step_{best}"
        if whole(path):
            return path
    return next((p for p in checkpoints(stage_dir) if whole(p)), None)


def final_checkpoints(run_dir, stages: list[str]) -> dict[str, Path]:
    """role ("manager" / "answer") -> the final checkpoint of its last stage in `stages` that has one
    (a "<role>_control" or "<role>_rs" stage is a control beside the policy, never the role's policy)."""
    out = {}
    for name in stages:
        if not stage_name(name).baseline and (ckpt := final_checkpoint(Path(run_dir) / name)) is not None:
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


def save(learner, stage_dir: str, step: int, data_state: dict | None = None, model_dir: str = "") -> str:
    """Write `stage_dir/checkpoints/step_<step>/` from `learner.state_dict()`, named by the caller's (the
    loop's) step; `data_state` is handed back by load(); `model_dir` lends its tokenizer and generation
    files."""
    rank = learner.rank
    final = os.path.join(stage_dir, "checkpoints", f"step_{step}")
    tmp = final + ".tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    learner.barrier()
    sd = learner.state_dict()   # gathers are collectives: every rank calls it; rank 0 alone writes
    torch.save(_rng_state(), os.path.join(tmp, f"rng_rank{rank}.pt"))
    if rank == 0:
        sd["config"].save_pretrained(tmp)
        if model_dir:
            copy_model_files(model_dir, tmp)
        save_file(sd["model"], os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        if "adapter" in sd:   # LoRA: the adapter as `peft.PeftModel.from_pretrained(base, <ckpt>/adapter)` reads it
            os.makedirs(os.path.join(tmp, ADAPTER_DIR))
            save_file(sd["adapter"], os.path.join(tmp, ADAPTER_FILES[0]), metadata={"format": "pt"})
            learner.adapter_config(model_dir).save_pretrained(os.path.join(tmp, ADAPTER_DIR))
        torch.save(sd["optimizer"], os.path.join(tmp, "optimizer.pt"))
        torch.save(sd["scheduler"], os.path.join(tmp, "scheduler.pt"))
        if "critic" in sd:
            torch.save(sd["critic"], os.path.join(tmp, "critic.pt"))
        with open(os.path.join(tmp, "state.json"), "w") as f:
            json.dump({"step": step, "learner_step": sd["step"], "weight_version": sd["version"],
                       "world_size": learner.world, "data": data_state or {}}, f)
    learner.barrier()
    if rank == 0:
        write_manifest(tmp, step)   # last, so it lists every rank's files
        if os.path.exists(final):  # re-saving the same step: swap, then drop the old copy
            shutil.rmtree(final + ".old", ignore_errors=True)
            os.rename(final, final + ".old")
        os.rename(tmp, final)
        shutil.rmtree(final + ".old", ignore_errors=True)
    learner.barrier()
    return final


def load(learner, path: str) -> dict:
    """Restore everything `save` wrote into an already built learner; returns the data cursor. Every
    file is read before the learner changes."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise ValueError(f"{path} is not a checkpoint: it has no config.json")
    with open(cfg_path) as f:
        sd = {"config": json.load(f)}
    sd["model"] = load_file(os.path.join(path, "model.safetensors"))
    if os.path.exists(os.path.join(path, ADAPTER_FILES[0])):
        sd["adapter"] = load_file(os.path.join(path, ADAPTER_FILES[0]))
    sd["optimizer"] = _load(os.path.join(path, "optimizer.pt"))
    sd["scheduler"] = _load(os.path.join(path, "scheduler.pt"))
    if os.path.exists(os.path.join(path, "critic.pt")):
        sd["critic"] = _load(os.path.join(path, "critic.pt"))
    with open(os.path.join(path, "state.json")) as f:
        state = json.load(f)
    sd["step"], sd["version"] = state["learner_step"], state["weight_version"]
    rank = learner.rank
    rng = os.path.join(path, f"rng_rank{rank}.pt")
    rng_state = _load(rng) if os.path.exists(rng) else None
    if rng_state is None and rank < int(state.get("world_size", 1)):   # a rank the run never had starts fresh streams
        raise CheckpointError(f"checkpoint {path} has no rng_rank{rank}.pt, which its run wrote")
    try:
        learner.load_state_dict(sd)
    except ValueError as e:
        raise ValueError(f"checkpoint {path}: {e}") from e
    if rng_state is not None:
        _set_rng_state(rng_state)
    return state
