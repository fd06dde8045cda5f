"""What every backend shares around its engine calls, so bad input and bad weights fail the same way on
each of them. A backend implements only the engine's side:

- `sample(ids, n, sampling)`: the engine run on checked token-id prompts, per prompt n
  (token_ids, logprobs, text, finish_reason) tuples; this class makes the Completion records.
- `load_weights(tensors)`: copy a checked stream of (name, tensor) into the live model in place.
- `named_shapes()`: name -> shape of the weights an update must bring.
An engine that can hold LoRA adapters (the HF backend) also implements `hold_adapters`, `adapter_shapes`
and `reset_adapters`; then an update is either of the model (its weights by HF name: the adapters are
zeroed, so the engine runs exactly the weights pushed) or of the adapters alone (`part="adapter"`).
"""
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from memr1.engine.generation.base import NEEDS_WEIGHTS, check_sampling, tokenize_prompts
from memr1.engine.generation.config import GeneratorConfig
from memr1.engine.generation.weights import ManifestStream, check_named_tensors, stream
from memr1.rl.generation import Completion, SamplingConfig

Sample = tuple[list[int], list[float], str, str]  # token ids, logprobs, text, finish reason


class Backend:
    cfg: GeneratorConfig
    tokenizer: Any
    vocab_size: int
    weight_version: int = 0
    asleep: bool = False         # only an engine with a sleep mode sets it
    needs_weights: bool = False  # a broken update (or a sleep that dropped the weights) left no complete model
    adapter_base: str | None = None  # the LoRA learner (its base_token) whose base weights are under the adapters

    # ---- what a backend implements ----
    def sample(self, ids: list[list[int]], n: int, sampling: SamplingConfig) -> list[list[Sample]]:
        raise NotImplementedError

    def load_weights(self, tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
        raise NotImplementedError

    def named_shapes(self) -> dict[str, tuple[int, ...]]:
        raise NotImplementedError

    def hold_adapters(self, config) -> bool:
        """Hold LoRA adapters of `config` (a peft.LoraConfig) that adapter-only updates can fill; False
        when this engine cannot (then a LoRA learner's pushes are merged weights)."""
        return False

    def adapter_shapes(self) -> dict[str, tuple[int, ...]]:
        """name -> shape of the adapters' A and B (empty: none held)."""
        return {}

    def reset_adapters(self) -> None:
        """Zero the adapters' contribution (no-op when none are held)."""

    def weight_target(self) -> tuple[torch.device, torch.dtype] | None:
        """Where load_weights wants new tensors: they are then moved there generator.weight_bucket_mb at
        a time first. None: they arrive as the producer made them (the backend casts each itself)."""
        return None

    def sleep(self) -> None:
        """No-op unless the engine has a sleep mode."""

    def wake(self) -> None:
        """No-op, see sleep()."""

    # ---- the contract (memr1.rl.generation.Generator) ----
    def generate(self, prompts, n: int, sampling: SamplingConfig) -> list[list[Completion]]:
        self.check_ready("generate")
        check_sampling(sampling, n, self.cfg.max_model_len)
        ids = tokenize_prompts(prompts, self.tokenizer, self.vocab_size, self.cfg.max_model_len,
                               sampling.max_new_tokens, self.cfg.truncate_prompts)
        version = self.weight_version
        rows = self.sample(ids, n, sampling)
        return [[Completion(prompt_index=i, token_ids=toks, logprobs=lps, text=text, finish_reason=reason,
                            weight_version=version, prompt_token_ids=list(ids[i]))
                 for toks, lps, text, reason in row] for i, row in enumerate(rows)]

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int,
                       manifest: dict[str, tuple[int, ...]] | None = None, part: str = "model") -> None:
        """See memr1.rl.generation.Generator.update_weights. Pass `manifest` when the tensors are made on
        demand (a learner's export): without it every tensor is referenced at once before loading.
        `part`: "model" (every weight; held adapters are zeroed after) or "adapter" (A and B alone, onto
        the base weights the engine holds)."""
        if self.asleep:
            raise RuntimeError("update_weights called while asleep; call wake() first")
        if part not in ("model", "adapter"):
            raise ValueError(f"update_weights part {part!r}: 'model' or 'adapter'")
        # Both checks run before the first tensor moves, so a bad set (or manifest) loads nothing.
        expected = self.named_shapes() if part == "model" else self.adapter_shapes()
        if part == "adapter" and not expected:
            raise ValueError("update_weights refused, nothing was loaded: part='adapter' but this engine holds "
                             "no adapters (hold_adapters)")
        if manifest is None:
            checked = check_named_tensors(named_tensors, expected)
        else:
            checked = ManifestStream(named_tensors, manifest, expected)
        target = self.weight_target()
        tensors = iter(checked) if target is None else stream(checked, self.cfg.weight_bucket_mb, *target)
        self.needs_weights = True  # until the load completes: a failure part-way leaves a mix of two models
        self.load_weights(tensors)
        if manifest is not None:
            checked.raise_if_broken()
        if part == "model":
            self.reset_adapters()
            self.adapter_base = None
        self.weight_version = int(version)
        self.needs_weights = False

    def check_ready(self, what: str) -> None:
        if self.asleep:
            raise RuntimeError(f"{what} called while asleep; call wake() first")
        if self.needs_weights:
            raise RuntimeError(f"{what} refused: {NEEDS_WEIGHTS}")
