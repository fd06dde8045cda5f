"""`memr1 train --dry-run`: the resolved plan and a per-rank memory estimate, checked against the
machine before anything starts. Estimates come from the model's config.json, not from loading it.
A plan can be made on any machine: planning a GPU run (or for a model that is elsewhere) from a CPU
machine prints the plan and says what it could not check here."""
import json
import os

import torch

from memr1.engine.config.resolve import budget_warnings, env_world, problems
from memr1.engine.config.run import RunConfig
from memr1.engine.config.stages import stage_config, stage_name
from memr1.rl.task.agents.answer import reply_bound

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
    rollouts = max(s.prompts_per_step * s.group_size for s in stage_configs(cfg).values()) // world
    est = {
        "params": n,
        # FSDP shards parameters, gradients and AdamW's two moments; fp32 master weights on every path.
        "learner_weights_gib": n * 4 / world / GiB,
        "learner_grads_gib": n * 4 / world / GiB,
        "optimizer_gib": n * 8 / world / GiB,
        "reference_gib": (n * compute_bytes / world / GiB) if cfg.learner.loss.kl_coef else 0.0,
        "critic_gib": (n * 16 / world / GiB) if cfg.learner.algo == "ppo" else 0.0,
        # one micro-batch of activations: hidden states kept per layer (about 16 values per token-dim)
        "activations_gib": cfg.learner.micro_batch_tokens * h * layers * 16 * compute_bytes / GiB,
        "generator_weights_gib": n * compute_bytes / GiB * 2,   # the policy engine and the swap engine
        "kv_cache_gib": rollouts * seq * layers * 2 * kv_dim * compute_bytes / GiB,
    }
    est["total_gib"] = sum(v for k, v in est.items() if k.endswith("_gib"))
    return est


def stage_configs(cfg: RunConfig) -> dict:
    return {name: stage_config(cfg, name) for name in cfg.stages}


def plan_text(cfg: RunConfig, dry_run: bool = True) -> tuple[str, bool]:
    """(the plan, whether it can start). A dry run only fails on problems of the plan itself."""
    from memr1.engine.generation import resolve_model

    on_gpu = cfg.learner.device.startswith("cuda")
    world = env_world()
    lines = [f"run {cfg.name}: stages {' -> '.join(cfg.stages)}, algo {cfg.learner.algo}, reward {cfg.reward.kind}, "
             f"max_staleness {cfg.loop.max_staleness}",
             f"placement: {world} rank(s), learner on {cfg.learner.device}, generator backend "
             f"{cfg.generator.backend} colocated on the same device(s)"]
    for name, s in stage_configs(cfg).items():
        budget = cfg.manager.max_new_tokens if stage_name(name).role == "manager" else cfg.answer.max_new_tokens
        if stage_name(name).kind == "episode":
            e = cfg.episode
            phases = ", ".join(f"{p.sessions} sessions x {p.steps} steps (lam {p.compression:g})" for p in e.phases(s.steps))
            lines.append(f"  {name:13} {s.steps:>5} steps x {s.prompts_per_step} windows x {s.group_size} episodes, "
                         f"every call of each; per session a re-roll group of {e.inner_n} with p {e.reroll_prob:g}; "
                         f"phases: {phases}; lr {s.lr:g}, up to {budget} new tokens a call")
            continue
        if cfg.rollout.replay:
            lines.append(f"  {name:13} {s.steps:>5} recorded steps replayed from {', '.join(cfg.rollout.replay)} "
                         f"(nothing generated for training), lr {s.lr:g}")
            continue
        lines.append(f"  {name:13} {s.steps:>5} steps x {s.prompts_per_step} prompts x {s.group_size} = "
                     f"{s.prompts_per_step * s.group_size} completions/step ({s.prompts_per_step // max(world, 1)} "
                     f"prompts per rank), lr {s.lr:g}, up to {budget} new tokens")
        if cfg.rollout.refill and stage_name(name).kind in ("rl", "rs"):   # rl/task/stages/calls.py's refill
            extra = cfg.rollout.refill_max_prompts or s.prompts_per_step
            lines.append(f"  {'':13} refill: up to {extra} extra prompts a step, so at most "
                         f"{(s.prompts_per_step + extra) * s.group_size} completions/step and "
                         f"{(s.prompts_per_step + extra) * s.group_size * budget:,} new tokens/step")
    lines.append(f"token budgets: extract {cfg.extract.max_new_tokens}, manager {cfg.manager.max_new_tokens}, answer "
                 f"{cfg.answer.max_new_tokens} (a well-formed answer takes at most {reply_bound(cfg.answer)})")
    found = problems(cfg, world) + [f"warning: {w}" for w in budget_warnings(cfg)]
    lines += found
    fits = not problems(cfg, world)
    if on_gpu and not torch.cuda.is_available():
        if not dry_run:
            return "\n".join(lines + [f"learner.device={cfg.learner.device!r} but this machine has no CUDA device; "
                                      f"use learner.device=cpu"]), False
        lines.append("memory: not checked (planned for CUDA on a machine without one)")
        return "\n".join(lines), fits
    try:
        model_dir = resolve_model(cfg.generator.model)
    except ValueError as e:
        lines.append(f"memory: not checked ({e})")
        return "\n".join(lines), fits and dry_run
    est = estimate(cfg, json.loads((model_dir / "config.json").read_text()), world, on_gpu)
    if on_gpu:
        available = torch.cuda.get_device_properties(0).total_memory / GiB
    else:
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB / world
    room = est["total_gib"] < 0.9 * available
    lines.append(f"model {model_dir} ({est['params'] / 1e6:.1f}M params); per rank:")
    lines += [f"  {k:<24}{v:8.2f} GiB" for k, v in est.items() if k.endswith("_gib")]
    lines.append(f"available per rank: {available:.1f} GiB -> {'fits' if room else 'DOES NOT FIT'}")
    return "\n".join(lines), fits and room
