"""Engine-side generation settings and the input checks every backend shares (so bad input fails the
same clear way everywhere). The contract itself (SamplingConfig, Completion, Generator) is
`memr1.rl.generation`: rl/ defines it, engine/ is on top."""
from typing import Annotated

import msgspec
import torch
from msgspec import Meta

from memr1.rl.generation import SamplingConfig, chat_prompt_ids


class GeneratorConfig(msgspec.Struct, kw_only=True):
    backend: str = "auto"  # "vllm" | "hf" | "auto" (vllm when importable)
    model: str = "default"  # "default" = converted SmolLM2-135M-Instruct; else a local HF checkpoint dir
    dtype: str = "auto"  # "auto" keeps the checkpoint's dtype; "fast": bfloat16 where the hardware multiplies
                         # it natively (GPUs, CPUs with AMX or AVX512-BF16), else the checkpoint's
    max_model_len: Annotated[int, Meta(ge=1)] = 4096  # prompt + new tokens
    truncate_prompts: bool = False  # keep the last tokens of an over-long prompt instead of raising
    gpu_memory_utilization: Annotated[float, Meta(gt=0, le=1)] = 0.3
    enforce_eager: bool = True
    weight_bucket_mb: Annotated[int, Meta(ge=1)] = 256  # new weights move to the engine this much at a time
    batch_size: Annotated[int, Meta(ge=1)] = 64  # prompts per generate call when building banks and evaluating
    sleep_level: Annotated[int, Meta(ge=1, le=2)] = 1  # vLLM sleep mode on GPU: 1 offloads weights to CPU, 2 drops them
    cache_dir: str = ""  # vLLM caches and IPC files; "" = $MEMR1_CACHE/vllm


NEEDS_WEIGHTS = ("the model holds no complete weights (sleep level 2 dropped them, or an update_weights stream "
                 "broke part-way); call update_weights() with the full model first")

BACKENDS = ("auto", "vllm", "hf")
DTYPES = ("auto", "fast", "float32", "bfloat16", "float16")


def engine_dtype(dtype: str) -> str:
    """A config dtype with "fast" resolved for this machine (see GeneratorConfig.dtype)."""
    if dtype != "fast":
        return dtype
    from memr1.engine.throughput import native_bf16
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


def check_sampling(s: SamplingConfig, n: int, max_model_len: int) -> None:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n (samples per prompt) must be an int >= 1, got {n!r}")
    if s.temperature < 0:
        raise ValueError(f"SamplingConfig.temperature must be >= 0, got {s.temperature}")
    if not 0.0 < s.top_p <= 1.0:
        raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {s.top_p}")
    if s.top_k != -1 and s.top_k < 1:
        raise ValueError(f"SamplingConfig.top_k must be -1 (off) or >= 1, got {s.top_k}")
    if s.max_new_tokens < 1:
        raise ValueError(f"SamplingConfig.max_new_tokens must be >= 1, got {s.max_new_tokens}")
    if s.max_new_tokens >= max_model_len:
        raise ValueError(f"SamplingConfig.max_new_tokens={s.max_new_tokens} leaves no room for a prompt "
                         f"within max_model_len={max_model_len}")
    if any(not isinstance(x, str) or not x for x in s.stop):
        raise ValueError(f"SamplingConfig.stop must hold non-empty strings, got {s.stop!r}")


def tokenize_prompts(prompts, tokenizer, vocab_size: int, max_model_len: int, max_new_tokens: int,
                     truncate: bool) -> list[list[int]]:
    """Token-id lists or chat message lists -> checked token-id lists that fit, with the new tokens,
    in max_model_len. Over-long prompts raise, or keep their last tokens when `truncate` (the end
    holds the question and the generation prompt, which matter most)."""
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of token-id lists or chat message lists")
    budget = max_model_len - max_new_tokens
    out = []
    for i, p in enumerate(prompts):
        if not isinstance(p, (list, tuple)) or not p:
            raise ValueError(f"prompt {i} is empty (or not a list); every prompt needs at least one token")
        if all(isinstance(m, dict) for m in p):
            ids = chat_to_ids(p, tokenizer, i)
        elif all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            ids = list(p)
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"prompt {i} holds token ids outside [0, {vocab_size}): {bad[:5]}")
        else:
            raise ValueError(f"prompt {i} must be all ints (token ids) or all dicts (chat messages)")
        if len(ids) > budget:
            if not truncate:
                raise ValueError(f"prompt {i} has {len(ids)} tokens; with max_new_tokens={max_new_tokens} "
                                 f"at most {budget} fit in max_model_len={max_model_len} "
                                 f"(or set truncate_prompts=true)")
            ids = ids[-budget:]
        out.append(ids)
    return out


def chat_to_ids(messages: list[dict], tokenizer, i: int) -> list[int]:
    for m in messages:
        if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"prompt {i}: each chat message needs string 'role' and 'content', got {m!r}")
    ids = chat_prompt_ids(tokenizer, messages)
    if not ids:
        raise ValueError(f"prompt {i}: the chat template produced no tokens")
    return ids


def cut_at_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """Text up to the earliest stop string (excluded), and whether one was found."""
    cuts = [text.find(s) for s in stop if s in text]
    return (text[:min(cuts)], True) if cuts else (text, False)
