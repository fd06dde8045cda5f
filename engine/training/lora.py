"""LoRA for the learner, through peft: adapters injected into the HF model in place (the model keeps
its class, so FSDP2 shards it and the policy runs it as any other), only A and B trained.

Names: peft turns a target `...q_proj.weight` into `...q_proj.base_layer.weight` plus
`...q_proj.lora_A.default.weight` and `...lora_B.default.weight`. What leaves the learner is in HF
names again:
- merged weights (`W + B A * alpha / rank`) under the original names, for the generator's pushes and
  the checkpoint's model.safetensors, which transformers loads as is and every later stage, eval and
  resume reads like any checkpoint;
- the adapter alone in peft's layout (adapter_model.safetensors + adapter_config.json), which
  `peft.PeftModel.from_pretrained(base, checkpoint)` loads, and which a resume restores onto the
  stage's start model (the base weights never change under LoRA).
What a generator gets (generation.weights.push_weights): a backend that holds the same adapters (the
HF backend) gets the base weights once per learner and then A and B alone on every push; any other
(vLLM here) gets merged weights of every parameter, as many bytes as a full-model push.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import torch

from memr1.engine.generation.weights import PEFT_BASE as BASE, hf_name, is_adapter

ADAPTER = "default"   # peft's adapter name; one adapter per learner
PARTS = ("merged", "base", "adapter")   # what a LoRA learner can export (Learner.export_weights)


def add_adapters(lm: torch.nn.Module, cfg) -> torch.nn.Module:
    """Inject rank-`cfg.rank` adapters into `cfg.targets` of `lm` and leave only them trainable."""
    import peft

    lm.requires_grad_(False)
    try:
        lm = peft.inject_adapter_in_model(peft_config(cfg), lm, adapter_name=ADAPTER)
    except ValueError as e:   # peft's own message when no target matches
        raise ValueError(f"learner.lora.targets={list(cfg.targets)}: no module of the model has such a name "
                         f"({str(e).splitlines()[0][:200]})") from None
    if not any(is_adapter(n) for n, _ in lm.named_parameters()):
        raise ValueError(f"learner.lora.targets={list(cfg.targets)}: no module of the model has such a name")
    for name, p in lm.named_parameters():
        p.requires_grad_(is_adapter(name))
    return lm


def scaling(cfg) -> float:
    return cfg.alpha / cfg.rank


def merged_items(names: Iterable[str], get, scale: float) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, merged tensor) for every non-adapter parameter among `names` (the adapted model's),
    one at a time; `get(name)` returns a parameter's full tensor (an adapted weight's A and B are
    fetched beside it)."""
    for name in names:
        if is_adapter(name):
            continue
        t = get(name)
        if name.endswith(BASE + ".weight"):
            prefix = name[: -len(BASE + ".weight")]
            a, b = get(f"{prefix}.lora_A.{ADAPTER}.weight"), get(f"{prefix}.lora_B.{ADAPTER}.weight")
            t = t + (b.to(t.dtype) @ a.to(t.dtype)) * scale
        yield hf_name(name), t


def split_state(sd: dict[str, torch.Tensor], scale: float) -> tuple[dict, dict]:
    """A full state dict of the adapted model -> (merged weights by HF name, the adapter in peft's
    saved layout: `base_model.model.<module>.lora_A.weight`)."""
    merged = dict(merged_items(sd, sd.__getitem__, scale))
    adapter = {"base_model.model." + k.replace(f".{ADAPTER}.", "."): v for k, v in sd.items() if is_adapter(k)}
    return merged, adapter


def adapter_params(saved: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """peft's saved layout -> the adapted model's parameter names."""
    out = {}
    for k, v in saved.items():
        name = k.removeprefix("base_model.model.")
        for part in ("lora_A", "lora_B"):
            name = name.replace(f".{part}.weight", f".{part}.{ADAPTER}.weight")
        out[name] = v
    return out


def peft_config(cfg, base_model: str = ""):
    """The adapter's peft.LoraConfig (saved as adapter_config.json beside the adapter)."""
    import peft

    return peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, target_modules=list(cfg.targets),
                           lora_dropout=cfg.dropout, bias="none", base_model_name_or_path=base_model or None)
