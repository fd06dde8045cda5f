"""`memr1 train --dry-run`: the resolved plan and a per-rank memory estimate, checked against the
machine before anything starts. Estimates come from the model's config.json, not from loading it."""
import json
import os

import torch

from memr1.engine.config import RunConfig
from memr1.engine.stages import world_problem

GiB = 2**30


def count_params(c: dict) -> int:
    h, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    heads, kv = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    head_dim = c.get("head_dim", h // heads)
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2
    mlp = 3 * h * c["intermediate_size"]
    embed = vocab * h * (1 if c.get("tie_word_embeddings") else 2)
    return layers * (attn + mlp + 2 * h) + embed + h


def estimate(cfg: RunConfig, model_config: dict, world: int, on_gpu: bool) -> dict:
    n = count_params(model_config)
    h, layers = model_config["hidden_size"], model_config["num_hidden_layers"]
    kv_dim = model_config.get("num_key_value_heads", model_config["num_attention_heads"]) * \
        model_config.get("head_dim", h // model_config["num_attention_heads"])
    compute_bytes = 2 if on_gpu else 4
    seq = cfg.generator.max_model_len
    rollouts = cfg.stage.prompts_per_step * cfg.stage.group_size
    tokens_per_step = rollouts * seq
    est = {
        "params": n,
        # FSDP shards parameters, gradients and AdamW's two moments; fp32 master weights on every path.
        "learner_weights_gib": n * 4 / world / GiB,
        "learner_grads_gib": n * 4 / world / GiB,
        "optimizer_gib": n * 8 / world / GiB,
        "reference_gib": (n * compute_bytes / world / GiB) if cfg.learner.loss.kl_coef else 0.0,
        # one micro-batch of activations: hidden states kept per layer (about 16 values per token-dim)
        "activations_gib": cfg.learner.micro_batch_tokens * h * layers * 16 * compute_bytes / GiB,
        "generator_weights_gib": n * compute_bytes / GiB * (2 if "manager" in cfg.stages else 1),
        "kv_cache_gib": rollouts * seq * layers * 2 * kv_dim * compute_bytes / GiB,
        "tokens_per_step": tokens_per_step,
    }
    est["total_gib"] = sum(v for k, v in est.items() if k.endswith("_gib"))
    return est


def plan_text(cfg: RunConfig) -> tuple[str, bool]:
    from memr1.engine.generation import resolve_model

    on_gpu = cfg.learner.device.startswith("cuda")
    if on_gpu and not torch.cuda.is_available():
        return (f"learner.device={cfg.learner.device!r} but this machine has no CUDA device; "
                f"use learner.device=cpu"), False
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rollouts = cfg.stage.prompts_per_step * cfg.stage.group_size
    if problem := world_problem(cfg.stage.prompts_per_step, world):
        return problem, False
    model_dir = resolve_model(cfg.generator.model)
    est = estimate(cfg, json.loads((model_dir / "config.json").read_text()), world, on_gpu)
    if on_gpu:
        available = torch.cuda.get_device_properties(0).total_memory / GiB
    else:
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB / world
    fits = est["total_gib"] < 0.9 * available
    lines = [f"run {cfg.name}: stages {cfg.stages}, {cfg.loop.steps} steps each, algo {cfg.learner.algo}, "
             f"max_staleness {cfg.loop.max_staleness}",
             f"placement: {world} rank(s), learner on {cfg.learner.device}, generator backend "
             f"{cfg.generator.backend} colocated on the same device(s)",
             f"model {model_dir} ({est['params'] / 1e6:.1f}M params)",
             f"per step: {rollouts} rollouts ({cfg.stage.prompts_per_step} prompts x {cfg.stage.group_size}), "
             f"up to {est['tokens_per_step']:,} tokens"]
    lines += [f"  {k:<24}{v:8.2f} GiB" for k, v in est.items() if k.endswith("_gib")]
    lines.append(f"available per rank: {available:.1f} GiB -> {'fits' if fits else 'DOES NOT FIT'}")
    return "\n".join(lines), fits
