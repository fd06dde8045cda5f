"""Memory-R1's agents as prompts and parsers: fact extraction, the Memory Manager, the Answer Agent.

Nothing here runs a model. Code that does (the engine's generators, an OpenAI-compatible client in
`memr1.rl.judge`) is reached through the small `Generator` protocol below, so `rl/` never imports
`engine/`.
"""
from typing import Any, Protocol, Sequence


class Completion(Protocol):
    text: str
    token_ids: Sequence[int]
    logprobs: Any
    finish_reason: str | None


class Generator(Protocol):
    def generate(self, prompts: list, n: int, sampling: Any) -> list[list[Completion]]:
        """prompts: chat message lists (or token id lists); returns n completions per prompt."""
        ...
