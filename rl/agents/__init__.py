"""Memory-R1's agents as prompts and parsers: fact extraction, the Memory Manager, the Answer Agent.

Nothing here runs a model. Code that does (the engine's generators, an OpenAI-compatible client in
`memr1.rl.judge`) is reached through the small `Generator` protocol below, so `rl/` never imports
`engine/`. `SamplingConfig` is the one sampling type every generator takes.
"""
from typing import Any, Protocol, Sequence

import msgspec


class SamplingConfig(msgspec.Struct, kw_only=True, frozen=True):
    temperature: float = 1.0  # 0 means greedy; its logprobs are then of the unscaled distribution
    top_p: float = 1.0
    top_k: int = -1  # -1 disables top-k
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    seed: int | None = None   # per-call seed; None draws from the engine's own (run-seeded) stream
    ignore_eos: bool = False

    def with_tokens(self, n: int) -> "SamplingConfig":
        return msgspec.structs.replace(self, max_new_tokens=n)


GREEDY = SamplingConfig(temperature=0.0)


class Completion(Protocol):
    text: str
    token_ids: Sequence[int]
    logprobs: Any
    finish_reason: str | None   # "length" when the completion hit max_new_tokens


class Generator(Protocol):
    def generate(self, prompts: list, n: int, sampling: SamplingConfig) -> list[list[Completion]]:
        """prompts: chat message lists (or token id lists); returns n completions per prompt."""
        ...


def hit_cap(completion) -> bool:
    """Whether a completion stopped at its token budget (so its text may be cut)."""
    return getattr(completion, "finish_reason", None) == "length"


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """A chat prompt's token ids, ending with the assistant's turn header (what generators sample after)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def reply_ids(tokenizer, text: str) -> list[int]:
    """A scripted reply's token ids as the policy would write them: the text, then the end of turn."""
    return tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
