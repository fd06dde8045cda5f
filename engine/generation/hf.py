"""Reference backend: transformers `generate`. A baseline to check the vLLM backend against and a
fallback where vLLM is absent, not a second engine to optimise.

Logprobs come from the scores `generate` samples from (after temperature / top-k / top-p), so they
are of the same distribution as the vLLM backend's `processed_logprobs`.

LoRA: `hold_adapters` injects peft adapters into the model in place (the learner's own way, so their
parameter names match the learner's), after which a push may carry A and B alone. The model's base
weights keep their HF names for updates; peft's `.base_layer` is hidden from the names."""
from collections.abc import Iterator
from pathlib import Path

import torch

from memr1.engine.generation.backend import Backend, Sample
from memr1.engine.generation.base import cut_at_stop
from memr1.engine.generation.config import GeneratorConfig, engine_dtype
from memr1.engine.generation.weights import hf_name, is_adapter
from memr1.rl.generation import SamplingConfig

DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFGenerator(Backend):
    def __init__(self, cfg: GeneratorConfig, model_path: Path, seed: int = 0):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg = cfg
        # transformers samples from torch's global stream; seed it once from the run seed (per rank).
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        torch.manual_seed(seed + rank)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        dtype = DTYPE.get(engine_dtype(cfg.dtype), "auto")
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, attn_implementation="sdpa")
        self.model.to(self.device).eval()
        self.vocab_size = self.model.config.vocab_size
        self.eos_ids = self.stop_token_ids()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.adapters = None   # (rank, alpha, targets) of the adapters held, once hold_adapters injected them
        self._params = None    # params(), made once per module tree

    def stop_token_ids(self) -> list[int]:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return [eos] if isinstance(eos, int) else list(eos)

    @torch.no_grad()
    def sample(self, ids: list[list[int]], n: int, sampling: SamplingConfig) -> list[list[Sample]]:
        from transformers import GenerationConfig

        rows = [p for p in ids for _ in range(n)]  # prompt-major: row i*n + j is sample j of prompt i
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, p in enumerate(rows):  # left padding, so every row's new tokens start at column `width`
            input_ids[r, width - len(p):] = torch.tensor(p)
            mask[r, width - len(p):] = 1
        greedy = sampling.temperature == 0
        gen_cfg = GenerationConfig(
            do_sample=not greedy, temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p,
            top_k=None if greedy else max(sampling.top_k, 0),  # 0 = off (None would mean 50)
            max_new_tokens=sampling.max_new_tokens, min_new_tokens=0,
            eos_token_id=[] if sampling.ignore_eos else self.eos_ids,  # None would mean the model's
            pad_token_id=self.pad_id,
            stop_strings=list(sampling.stop) or None, output_scores=True, return_dict_in_generate=True)
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        out = self.model.generate(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device),
                                  generation_config=gen_cfg, tokenizer=self.tokenizer)
        new = out.sequences[:, width:]
        # One log_softmax per step over the processed scores; gather the sampled token of each row.
        scores = torch.stack(out.scores, dim=1).float()  # [rows, steps, vocab]
        logprobs = torch.log_softmax(scores, dim=-1).gather(-1, new[:, :scores.shape[1], None]).squeeze(-1).cpu()
        new = new.cpu()
        result = [[] for _ in ids]
        for r in range(len(rows)):
            toks, reason = self.trim(new[r].tolist(), sampling)
            text, _ = cut_at_stop(self.tokenizer.decode(toks, skip_special_tokens=True), sampling.stop)
            result[r // n].append((toks, logprobs[r, :len(toks)].tolist(), text, reason))
        return result

    def trim(self, toks: list[int], s: SamplingConfig) -> tuple[list[int], str]:
        """Cut a row where generation ended: at the first EOS (kept) or the token completing a stop
        string (kept); everything after is padding."""
        for j, t in enumerate(toks):
            if not s.ignore_eos and t in self.eos_ids:
                return toks[:j + 1], "stop"
            if s.stop and cut_at_stop(self.tokenizer.decode(toks[:j + 1]), s.stop)[1]:
                return toks[:j + 1], "stop"
        return toks, "length"

    def params(self) -> dict[str, torch.nn.Parameter]:
        """Every parameter under the name an update uses: HF names for the model's weights, the
        adapted model's names for A and B."""
        if self._params is None:   # walking an adapted model's modules costs milliseconds: once per tree
            self._params = {hf_name(k): p for k, p in self.model.named_parameters()}
        return self._params

    def named_shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(p.shape) for k, p in self.params().items() if not is_adapter(k)}

    def adapter_shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(p.shape) for k, p in self.params().items() if is_adapter(k)}

    def hold_adapters(self, config) -> bool:
        key = (config.r, config.lora_alpha, tuple(sorted(config.target_modules)))
        if self.adapters is None:
            import peft

            self.model = peft.inject_adapter_in_model(config, self.model, adapter_name="default").eval()
            self.model.requires_grad_(False)
            self.adapters, self._params = key, None
            self.reset_adapters()   # peft starts B at zero already; this makes it explicit
        return self.adapters == key

    @torch.no_grad()
    def reset_adapters(self) -> None:
        if self.adapters is None:
            return
        for name, p in self.params().items():
            if ".lora_B." in name:
                p.zero_()

    @torch.no_grad()
    def load_weights(self, tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
        params = self.params()
        for name, t in tensors:
            params[name].copy_(t)  # copy_ casts dtype and device per tensor: no second full copy
            del t
