"""The learner's settings (`[learner]` in a run config); training/learner.py runs them. Imports no torch:
the run config composes it, and reading a config must not load torch."""
from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from memr1.rl.algos.config import GRPOConfig, LossConfig, PPOConfig


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Low-rank adapters (peft's LoRA, training/lora.py): the learner trains only A and B of each target
    projection; rank 0 is off (every weight, or `train_layers`, is trained)."""
    rank: Annotated[int, Meta(ge=0, le=4096)] = 0
    alpha: Annotated[float, Meta(gt=0, le=1e6)] = 32.0     # the update is scaled by alpha / rank
    targets: tuple[str, ...] = LORA_TARGETS                 # module names (peft's target_modules)
    dropout: Annotated[float, Meta(ge=0, lt=1)] = 0.0       # above 0 the learner's log-probs are no longer
                                                            # the generator's (it runs without dropout)


class LearnerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    algo: Literal["grpo", "dr_grpo", "ppo"] = "grpo"   # dr_grpo: GRPO without std scaling and with a
                                       # constant-length token sum (config resolution sets both)
    device: str = "cpu"
    # CPU compute precision: fp32, or bf16 autocast (bf16 matmuls, fp32 master weights, gradients and
    # optimizer state, as on a GPU); "fast": bf16 where the CPU multiplies it natively (AMX or
    # AVX512-BF16), else fp32. GPUs always compute in bf16.
    cpu_precision: Literal["fp32", "bf16", "fast"] = "fp32"
    attn_impl: str = "auto"            # auto: flash_attention_2 if installed, else sdpa (the rows layout
                                       # always runs training/prefix_attention.py, which is SDPA-based)
    warmup_steps: Annotated[int, Meta(ge=0, le=1_000_000)] = 0       # linear warmup, then constant
    weight_decay: Annotated[float, Meta(ge=0, le=100)] = 0.0
    betas: tuple[Annotated[float, Meta(ge=0, lt=1)], Annotated[float, Meta(ge=0, lt=1)]] = (0.9, 0.999)
    grad_clip: Annotated[float, Meta(gt=0, le=1e6)] = 1.0
    micro_batch_tokens: Annotated[int, Meta(ge=1, le=1 << 24)] = 8192  # token budget per micro-batch (a shared prompt counts once)
    # Recompute each decoder block in backward instead of keeping its activations: far less memory
    # (they dominate at RL sequence lengths) for about a third more compute. TRL's default too.
    activation_checkpointing: bool = True
    train_layers: Annotated[int, Meta(ge=0, le=10_000)] = 0  # 0: train every weight; N: only the top N decoder blocks and the final
                                       # norm (the rest stay frozen, and backward stops below the lowest trained block)
    layout: Literal["auto", "packed", "rows"] = "auto"  # auto: packed with flash-attn, rows otherwise
    share_prefix: bool = True          # rows layout: one copy of a prompt shared by its group
    # Leave out groups whose advantages are all zero (equal rewards): without KL or entropy terms they
    # add nothing to the gradient. Off computes them anyway (bench.e2e's row that isolates this saving).
    skip_zero_advantage: bool = True
    pad_bucket: Annotated[int, Meta(ge=1, le=1 << 16)] = 64   # rows layout: row width rounds up to this
    # What the PPO ratio is taken against. "current": the learner's own log-probs before this step, as
    # verl and TRL do; with one optimizer step per batch (what this learner does) that ratio is exactly 1,
    # so the clip never acts, and what corrects for staleness is the truncated importance weight
    # against the behaviour log-probs (LossConfig). "behaviour": the sampler's log-probs themselves.
    anchor: Literal["current", "behaviour"] = "current"
    logprob_chunk: Annotated[int, Meta(ge=1, le=1 << 20)] = 1024
    lora: LoraConfig = msgspec.field(default_factory=LoraConfig)
    loss: LossConfig = msgspec.field(default_factory=LossConfig)
    grpo: GRPOConfig = msgspec.field(default_factory=GRPOConfig)
    ppo: PPOConfig = msgspec.field(default_factory=PPOConfig)
