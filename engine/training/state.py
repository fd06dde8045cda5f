"""The learner's state as full (unsharded) tensors, and back: FSDP2's state-dict plumbing.

What `Learner.state_dict()` returns and `load_state_dict` takes (checkpoints/io.py writes each
entry to its own file):
  config      the HF config (an object from `state_dict`; a loaded config.json's dict is accepted)
  model       the policy's full weights by HF name, the tied lm_head left out (with LoRA: merged)
  adapter     with LoRA only: the adapter in peft's saved layout (training/lora.py)
  optimizer   the policy's full optimizer state keyed by parameter name, so a run can resume on
              another world size; scheduler: the LR schedule's state
  critic      PPO only: {"model", "optim", "sched"} of the critic, likewise
  step, version   the learner's optimizer steps and weight version
Gathering is a collective (every rank calls it) and lands on CPU; with a process group only rank 0
gets the tensors. Loading wants the full state on every rank.
"""
from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
FULL_LOAD = StateDictOptions(full_state_dict=True)
# The fields that make two checkpoints the same network; anything else (dtype, attention) may differ.
SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "vocab_size", "tie_word_embeddings")


def hf_state_dict(policy) -> dict:
    """Full policy weights with HF names (the learner wraps the LM as `lm.`); tied lm_head dropped."""
    sd = get_model_state_dict(policy, options=FULL)
    sd = {k.removeprefix("lm."): v.contiguous() for k, v in sd.items()}
    if getattr(policy.lm.config, "tie_word_embeddings", False):
        sd.pop("lm_head.weight", None)
    return sd


def gather(policy, optim, sched, critic=None, critic_optim=None, critic_sched=None) -> dict:
    """The model, optimizer and scheduler entries of the state (and the critic's, when given)."""
    out = {"model": hf_state_dict(policy), "optimizer": get_optimizer_state_dict(policy, optim, options=FULL),
           "scheduler": sched.state_dict()}
    if critic is not None:
        out["critic"] = {"model": get_model_state_dict(critic, options=FULL),
                         "optim": get_optimizer_state_dict(critic, critic_optim, options=FULL),
                         "sched": critic_sched.state_dict()}
    return out


def check_compatible(saved, hf_config) -> None:
    """`saved` (a config or its dict) must describe the same network as `hf_config`."""
    saved = saved if isinstance(saved, dict) else saved.to_dict()
    ours = hf_config.to_dict()
    diff = [f"{k}: saved {saved.get(k)!r} vs model {ours.get(k)!r}" for k in SHAPE_KEYS if saved.get(k) != ours.get(k)]
    if diff:
        raise ValueError("the state is from a different model: " + "; ".join(diff))


def checked_weights(sd: dict, lm) -> dict:
    """`sd` (HF names) with the tied lm_head filled in, after checking it covers `lm` with the right shapes."""
    sd, ours = dict(sd), dict(lm.named_parameters())
    if getattr(lm.config, "tie_word_embeddings", False):
        sd.setdefault("lm_head.weight", sd.get("model.embed_tokens.weight"))
    missing = [k for k in lm.state_dict() if k not in sd and k in ours]
    wrong = [k for k, v in sd.items() if k in ours and tuple(v.shape) != tuple(ours[k].shape)]
    if missing or wrong:
        raise ValueError(f"the state does not match the model: missing {missing[:5]}, wrong shape {wrong[:5]}")
    return sd


def checked_subset(sd: dict, lm) -> dict:
    """`sd`: some of `lm`'s parameters (a LoRA adapter's), each present in `lm` with its shape; and
    every trainable parameter of `lm` among them."""
    ours = dict(lm.named_parameters())
    unknown = [k for k in sd if k not in ours]
    wrong = [k for k, v in sd.items() if k in ours and tuple(v.shape) != tuple(ours[k].shape)]
    missing = [k for k, p in ours.items() if p.requires_grad and k not in sd]
    if unknown or wrong or missing:
        raise ValueError(f"the adapter does not match the model's: unknown {unknown[:3]}, wrong shape {wrong[:3]}, "
                         f"missing {missing[:3]} (another learner.lora rank or targets?)")
    return sd


def load_model(policy, optim, sched, weights: dict, optim_sd: dict, sched_sd: dict, strict: bool = True) -> None:
    """`weights`: from `checked_weights`, or `checked_subset` with strict=False (the rest is kept)."""
    options = FULL_LOAD if strict else StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(policy, {"lm." + k: v for k, v in weights.items()}, options=options)
    set_optimizer_state_dict(policy, optim, optim_sd, options=FULL_LOAD)
    _unshare(optim, optim_sd)
    sched.load_state_dict(sched_sd)


def load_critic(critic, optim, sched, sd: dict) -> None:
    set_model_state_dict(critic, sd["model"], options=FULL_LOAD)
    set_optimizer_state_dict(critic, optim, sd["optim"], options=FULL_LOAD)
    _unshare(optim, sd["optim"])
    sched.load_state_dict(sd["sched"])


def _unshare(optim, given: dict) -> None:
    """Optimizer.load_state_dict keeps a given tensor that already has its parameter's device and dtype
    (an unsharded CPU model), so a state taken from another live learner would stay shared with it and
    both steps would update it: such tensors are copied."""
    ptrs = {t.data_ptr() for st in given["state"].values() for t in st.values() if isinstance(t, torch.Tensor)}
    for st in optim.state.values():
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and v.data_ptr() in ptrs:
                st[k] = v.clone()


def use_lr(optim, sched, lr: float) -> None:
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
