"""The learner's models: the causal LM with the fused log-prob kernel as one module, loading with
activation checkpointing (and freezing the lower blocks), and the optimizer and LR schedule every model of the learner uses."""
from __future__ import annotations

import torch
from torch import nn

from memr1 import kernels
from memr1.engine.training.dist import decoder_layers


class PolicyModel(nn.Module):
    """The causal LM plus the fused log-prob kernel in one forward, so that FSDP gathers the lm_head
    weight (the root's parameter) for exactly the span of the kernel call. Log-probs come from the final
    hidden states at response positions only: no [tokens, vocab] fp32 logits ever exist."""

    def __init__(self, lm: nn.Module, temperature: float, chunk: int):
        super().__init__()
        self.lm, self.temperature, self.chunk = lm, temperature, chunk

    def forward(self, micro, entropy: bool = False):
        base = getattr(self.lm, self.lm.base_model_prefix)
        hidden = base(**micro.model_inputs(), use_cache=False).last_hidden_state
        hidden = hidden.reshape(-1, hidden.shape[-1])[micro.index]
        weight = self.lm.get_output_embeddings().weight
        weight = weight if weight.dtype == hidden.dtype else weight.to(hidden.dtype)  # autocast: bf16 hidden
        return kernels.logprobs(hidden, weight, micro.targets,
                                temperature=self.temperature, entropy=entropy, chunk_tokens=self.chunk)


def load_lm(path: str, attn: str, checkpointing: bool, device: torch.device, head: bool = True) -> nn.Module:
    """The HF model at `path` in fp32 (the causal LM, or its backbone alone with head=False), with the
    attention implementation named `attn` (transformers' name, or prefix_attention.py's)."""
    from transformers import AutoModel, AutoModelForCausalLM
    cls = AutoModelForCausalLM if head else AutoModel
    model = cls.from_pretrained(path, dtype=torch.float32, attn_implementation=attn)
    if checkpointing:
        # Recompute each block in backward (non-reentrant, which FSDP2 needs). Blocks only recompute in
        # train mode; these models have no dropout, so train mode changes nothing else.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
    return model.to(device)


def freeze_below(lm, n: int) -> None:
    """Leave only the top `n` decoder blocks and the final norm trainable."""
    layers = decoder_layers(lm)
    if not 0 < n <= len(layers):
        raise ValueError(f"learner.train_layers={n}: the model has {len(layers)} decoder blocks")
    lm.requires_grad_(False)
    for block in list(layers)[-n:]:
        block.requires_grad_(True)
    norm = getattr(getattr(lm, lm.base_model_prefix), "norm", None)
    if norm is not None:
        norm.requires_grad_(True)


def adamw(params, lr: float, betas, weight_decay: float):
    # The fused kernel updates every parameter in one pass over the weights, where foreach makes several.
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=True)


def warmup_schedule(optim, warmup_steps: int):
    """Linear warmup, then constant (the paper's constant warmup)."""
    return torch.optim.lr_scheduler.LambdaLR(optim, lambda s: min(1.0, (s + 1) / warmup_steps) if warmup_steps else 1.0)
