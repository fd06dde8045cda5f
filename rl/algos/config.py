"""The RL algorithm's settings (`[learner.loss]`, `[learner.grpo]`, `[learner.ppo]`): the surrogate loss
(losses.py), GRPO's advantages (grpo.py), PPO's critic and GAE (ppo.py). Imports no torch: the
run config composes these, and reading a config must not load torch."""
from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

Aggregation = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KLEstimator = Literal["k1", "k2", "k3"]
AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


class LossConfig(msgspec.Struct, frozen=True, kw_only=True):
    clip_low: Annotated[float, Meta(ge=0, lt=1)] = 0.2   # ratio floor is 1 - clip_low
    clip_high: Annotated[float, Meta(ge=0, le=100)] = 0.2        # ratio ceiling is 1 + clip_high ("clip-higher" when > clip_low)
    dual_clip: Annotated[float, Meta(ge=0, le=1000)] = 3.0        # bound on the loss for negative advantages; 0 turns it off
    log_ratio_clamp: Annotated[float, Meta(gt=0, le=80)] = 20.0  # keeps exp() finite on wild log-ratios
    is_cap: Annotated[float, Meta(ge=0, le=1000)] = 2.0           # truncated importance weight behaviour -> old policy; 0 turns it off
    decoupled: bool = False          # AReaL: clip around the proximal policy, drop tokens with weight > is_cap
    kl_coef: Annotated[float, Meta(ge=0, le=1000)] = 0.0   # 0 means no reference model is ever loaded
    kl_estimator: KLEstimator = "k3"
    kl_in_reward: bool = False       # subtract coef * KL from the reward instead of adding it to the loss
    entropy_coef: Annotated[float, Meta(ge=0, le=1000)] = 0.0
    aggregation: Aggregation = "token-mean"
    horizon: Annotated[int, Meta(ge=0, le=1 << 24)] = 0       # constant length for seq-mean-token-sum-norm (Dr.GRPO); 0 = unset
    value_clip: Annotated[float, Meta(ge=0, le=1000)] = 0.2
    # What one importance ratio covers: each token, or the whole call (a response's mean token
    # log-ratio, as Memory-R2's turn-level ratio and GSPO take it), so a call's tokens clip together.
    ratio_level: Literal["token", "call"] = "token"

    def __post_init__(self):
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"LossConfig.aggregation={self.aggregation!r}; expected one of {AGGREGATIONS}")
        if self.kl_estimator not in ("k1", "k2", "k3"):
            raise ValueError(f"LossConfig.kl_estimator={self.kl_estimator!r}; expected k1, k2 or k3")
        if self.ratio_level not in ("token", "call"):
            raise ValueError(f"LossConfig.ratio_level={self.ratio_level!r}; expected token or call")
        if self.clip_low < 0 or self.clip_high < 0:
            raise ValueError("LossConfig.clip_low and clip_high must be >= 0")
        if self.dual_clip and self.dual_clip <= 1.0:
            raise ValueError(f"LossConfig.dual_clip={self.dual_clip} must be > 1 (or 0 to turn it off)")
        if self.aggregation == "seq-mean-token-sum-norm" and self.horizon <= 0:
            raise ValueError("aggregation 'seq-mean-token-sum-norm' needs LossConfig.horizon > 0")


class GRPOConfig(msgspec.Struct, frozen=True, kw_only=True):
    std: Literal["unbiased", "population", "none"] = "unbiased"
    baseline: Literal["mean", "loo"] = "mean"
    eps: Annotated[float, Meta(gt=0, le=1)] = 1e-6

    def __post_init__(self):
        if self.std not in ("unbiased", "population", "none"):
            raise ValueError(f"GRPOConfig.std={self.std!r}; expected unbiased, population or none")
        if self.baseline not in ("mean", "loo"):
            raise ValueError(f"GRPOConfig.baseline={self.baseline!r}; expected mean or loo")


def dr_grpo(horizon: int, loss: LossConfig | None = None) -> tuple[GRPOConfig, LossConfig]:
    """Dr.GRPO (Liu et al. 2025): no std scaling and a constant-length token sum, so neither the
    question's difficulty nor the answer's length reweights the gradient."""
    loss = loss or LossConfig()
    return GRPOConfig(std="none"), msgspec.structs.replace(loss, aggregation="seq-mean-token-sum-norm",
                                                           horizon=horizon)


class PPOConfig(msgspec.Struct, frozen=True, kw_only=True):
    gamma: Annotated[float, Meta(ge=0, le=1)] = 1.0
    lam: Annotated[float, Meta(ge=0, le=1)] = 1.0
    whiten: bool = True     # normalise advantages over the batch
    critic_lr: Annotated[float, Meta(gt=0, le=1)] = 1e-5
    critic_warmup: Annotated[int, Meta(ge=0, le=1_000_000)] = 0  # first steps train only the critic (the actor's update is skipped)
