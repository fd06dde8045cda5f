"""The one generation contract: what a generator is asked (SamplingConfig), what it returns (Completion)
and what it can do (the Generator protocol), plus the small helpers every caller shares.

It lives in rl/ because rl/ never imports engine/: the task's stages, evals and judge reach the engine's
backends (engine/generation/) only through this protocol, and those backends import it from here.
"""
from collections.abc import Iterable
from typing import Any, Protocol

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


class Completion(msgspec.Struct):
    prompt_index: int
    token_ids: list[int]
    logprobs: list[float]  # of each sampled token under the distribution it was sampled from
    text: str
    finish_reason: str  # "stop" (EOS or a stop string) | "length"
    weight_version: int
    prompt_token_ids: list[int]  # the prompt as sampled from (tokenised, possibly truncated)


class Generator(Protocol):
    tokenizer: Any
    weight_version: int

    def generate(self, prompts: list[list[int]] | list[list[dict]], n: int,
                 sampling: SamplingConfig) -> list[list[Completion]]:
        """prompts: token-id lists or chat message lists; returns n completions per prompt, in order."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int,
                       manifest: dict[str, tuple[int, ...]] | None = None) -> None:
        """Load a complete weight set in place and set weight_version; a bad set raises ValueError.

        Without `manifest` every (name, tensor) is collected and checked before the first load, so a
        bad set loads nothing, but references to ALL tensors are held at once. With `manifest`
        (name -> full shape, e.g. `Learner.weight_manifest()`) the manifest is checked first (a bad one
        loads nothing and draws nothing), then the tensors are streamed and each is released once
        loaded: callers streaming from a sharded learner must pass it. A stream that breaks its
        manifest part-way raises and leaves the generator refusing to generate until a complete
        update succeeds. An engine that holds LoRA adapters (`hold_adapters`) also takes
        `part="adapter"`: their A and B alone (engine.generation.weights.push_weights)."""
        ...

    def sleep(self) -> None: ...

    def wake(self) -> None: ...


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
