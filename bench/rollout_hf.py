"""The transformers side of bench.rollout: `model.generate` as a competent CPU user would run it, returning
what memr1's vLLM backend returns (each row's new token ids, the sampled tokens' log-probs, the text).

Variants (all SDPA attention, left padding, the rows of a prompt's group repeated prompt-major):
  dynamic           the default DynamicCache, eager
  static            a StaticCache of one size for every call of a prompt kind (`max_cache_len`), eager
  static_compiled   the same cache with generate's own torch.compile of the decoding forward
                    (CompileConfig, mode "default": "reduce-overhead" means CUDA graphs)
The log-prob of each sampled token is taken step by step from the scores generate sampled from, one
[rows, vocab] log_softmax per step as vLLM's sampler does, never a stacked [rows, steps, vocab] copy."""
import torch

VARIANTS = ("dynamic", "static", "static_compiled")


def generation_config(variant: str, max_new_tokens: int, pad_id: int, max_cache_len: int):
    from transformers import CompileConfig, GenerationConfig

    # Plain sampling at T=1 with EOS ignored: the same distribution and token count as the vLLM side
    # (top_k=0 turns off transformers' default top-k of 50; vLLM's -1).
    kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens, min_new_tokens=0,
              eos_token_id=[], pad_token_id=pad_id, output_scores=True, return_dict_in_generate=True)
    if variant == "dynamic":
        return GenerationConfig(**kw)
    if variant == "static":
        return GenerationConfig(cache_implementation="static", max_cache_len=max_cache_len, disable_compile=True, **kw)
    if variant == "static_compiled":
        cfg = GenerationConfig(cache_implementation="static", max_cache_len=max_cache_len, **kw)
        cfg.compile_config = CompileConfig(mode="default")
        # generate compiles only on accelerators unless told otherwise; this flag is transformers' switch for CPU.
        cfg.compile_config._compile_all_devices = True
        return cfg
    raise ValueError(f"unknown HF variant {variant!r}; one of {VARIANTS}")


class HFRunner:
    def __init__(self, model, tokenizer, variant: str, max_cache_len: int):
        self.model, self.tokenizer, self.variant, self.max_cache_len = model, tokenizer, variant, max_cache_len
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def settings(self) -> dict:
        return {"cache": "dynamic" if self.variant == "dynamic" else "static",
                "compile": self.variant == "static_compiled", "attn": self.model.config._attn_implementation,
                "dtype": str(self.model.dtype).removeprefix("torch."), "max_cache_len": self.max_cache_len,
                "device": str(self.model.device), "torch_threads": torch.get_num_threads()}

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, max_new_tokens: int, seed: int) -> list[dict]:
        rows = [p for p in prompts for _ in range(n)]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, p in enumerate(rows):
            ids[r, width - len(p):] = torch.tensor(p)
            mask[r, width - len(p):] = 1
        torch.manual_seed(seed)
        cfg = generation_config(self.variant, max_new_tokens, self.pad_id, self.max_cache_len)
        out = self.model.generate(input_ids=ids.to(self.model.device), attention_mask=mask.to(self.model.device),
                                  generation_config=cfg)
        new = out.sequences[:, width:]
        logprobs = torch.empty(new.shape, dtype=torch.float32, device=new.device)
        for t, scores in enumerate(out.scores):
            logprobs[:, t] = torch.log_softmax(scores.float(), -1).gather(1, new[:, t, None])[:, 0]
        new, logprobs = new.cpu(), logprobs.cpu()
        texts = self.tokenizer.batch_decode(new, skip_special_tokens=True)
        return [{"token_ids": new[r].tolist(), "logprobs": logprobs[r].tolist(), "text": texts[r],
                 "prompt_token_ids": rows[r]} for r in range(len(rows))]
