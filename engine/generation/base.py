"""The input checks every backend shares (so bad input fails the same clear way everywhere). The
settings are generation/config.py; the contract itself (SamplingConfig, Completion, Generator) is
`memr1.rl.generation`: rl/ defines it, engine/ is on top."""
from memr1.rl.generation import SamplingConfig, chat_prompt_ids

NEEDS_WEIGHTS = ("the model holds no complete weights (sleep level 2 dropped them, or an update_weights stream "
                 "broke part-way); call update_weights() with the full model first")


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
