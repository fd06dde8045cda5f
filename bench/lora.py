"""LoRA in the learner against full fine-tuning: peak memory, step time, and the weight push.

    python -m memr1.bench.lora [--quick] [--rounds N] [--rank 16] --json PATH

Each side runs in a fresh process (`--worker`), the sides alternating over rounds: a Learner on the
model (default: SmolLM2-135M-Instruct, configs/default.toml's; --quick: a random 4-layer Llama with
SmolLM2's tokenizer), with every layer trained and no activation checkpointing, `--steps` GRPO steps
on the same synthetic batch (8 groups of 4 responses of 64 tokens after a 256-token prompt), then
`--pushes` pushes of its weights into a transformers generator of the same model. The HF generator holds
the LoRA learner's adapters, so its first push moves the base weights and the adapters and every later
one A and B alone; the LoRA side also pushes merged weights into a second generator that holds none
(what vLLM here gets). Rows are medians over rounds of:
- peak_rss_mb: the rise of the process's peak RSS (VmHWM) over its RSS after the learner was built and
  before the first step, so the optimizer state and the gradients are in it and the model is not;
- step_ms; push_ms and push_bytes (what push_weights exported, the pushes after the first: for LoRA
  adapter-only); for LoRA merged_push_ms and merged_push_bytes;
- decode_tok_s: greedy decode tokens/s of the generator after the pushes (8 prompts x 32 new tokens),
  for LoRA with the adapters active, and merged_decode_tok_s on the merged weights;
- trainable_params, and for LoRA adapter_bytes: the bytes of A and B.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

IMPLS = ("full", "lora")
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def batch(seed: int = 0, groups: int = 8, size: int = 4, prompt: int = 256, response: int = 64):
    import torch

    from memr1.rl.records import Group, TrainBatch

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(groups):
        ids = torch.randint(100, 40000, (prompt,), generator=g).tolist()
        responses = [torch.randint(100, 40000, (response,), generator=g).tolist() for _ in range(size)]
        logps = [(-3.0 + 0.1 * torch.randn(response, generator=g)).tolist() for _ in range(size)]
        out.append(Group(ids, responses, logps, [float(j % 2) for j in range(size)], source=f"g{i}"))
    return TrainBatch(out)


def worker(impl: str, model: str, rank: int, steps: int, pushes: int, out: str) -> None:
    import torch

    from memr1.bench.common import status_mb
    from memr1.engine.generation import make_generator
    from memr1.engine.generation.config import GeneratorConfig
    from memr1.engine.generation.weights import is_adapter
    from memr1.engine.training.config import LearnerConfig, LoraConfig
    from memr1.engine.training.learner import Learner

    torch.manual_seed(0)
    lora = LoraConfig(rank=rank, alpha=2.0 * rank, targets=TARGETS) if impl == "lora" else LoraConfig()
    learner = Learner(LearnerConfig(lora=lora, activation_checkpointing=False), model, lr=1e-5)
    work = batch()
    before = status_mb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")   # VmHWM := VmRSS: the peak below is the steps' own
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        learner.train_step(work)
        times.append(time.perf_counter() - t0)
    peak = status_mb("VmHWM") - before
    cfg = GeneratorConfig(backend="hf", model=model, dtype="float32", max_model_len=1024)
    gen = make_generator(cfg)
    ms, pushed = pushes_into(learner, gen, pushes)
    adapter = sum(p.numel() * p.element_size() for n, p in learner.policy.lm.named_parameters() if is_adapter(n))
    got = {"impl": impl, "peak_rss_mb": peak, "step_ms": statistics.median(times[1:] or times) * 1e3,
           "push_ms": ms, "push_bytes": pushed, "decode_tok_s": decode_rate(gen),
           "trainable_params": learner.trainable_params, "total_params": learner.total_params,
           "adapter_bytes": adapter if impl == "lora" else None}
    if impl == "lora":   # the same learner into a generator that holds no adapters: merged pushes
        del gen
        merged = make_generator(cfg)
        merged.hold_adapters = lambda config: False
        got["merged_push_ms"], got["merged_push_bytes"] = pushes_into(learner, merged, pushes)
        got["merged_decode_tok_s"] = decode_rate(merged)
    with open(out, "w") as f:
        json.dump(got, f)


def pushes_into(learner, gen, pushes: int) -> tuple[float, int]:
    """(median ms, bytes) of the pushes after the first (the first of a LoRA learner also moves the base)."""
    from memr1.engine.generation.weights import push_weights

    times, pushed = [], 0
    for v in range(pushes):
        t0 = time.perf_counter()
        pushed = push_weights(learner, gen, v + 1)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:] or times) * 1e3, pushed


def decode_rate(gen, prompts: int = 8, tokens: int = 32, reps: int = 3) -> float:
    """Greedy decode tokens/s, the median of `reps` calls of `prompts` 64-token prompts."""
    from memr1.rl.generation import SamplingConfig

    ids = [[100 + (7 * p + i) % 4000 for i in range(64)] for p in range(prompts)]
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=tokens, ignore_eos=True)
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        gen.generate(ids, 1, sampling)
        rates.append(prompts * tokens / (time.perf_counter() - t0))
    return statistics.median(rates)


def model_path(quick: bool, folder: str) -> str:
    if quick:
        from memr1.bench.common import random_llama
        return str(random_llama(folder, layers=4, hidden=256, heads=8, kv_heads=4, ffn_mult=4))
    from memr1.engine.config.resolve import resolve
    from memr1.engine.config.run import load_config
    from memr1.bench.loop import DEFAULT_CONFIG
    return str(resolve(load_config(DEFAULT_CONFIG)).base_model)


def headline(rows: list[dict], rank: int) -> list[dict]:
    from memr1.bench.common import headline_entry

    by = {r["impl"]: r for r in rows}
    full, lo = by["full"], by["lora"]
    return [
        headline_entry("learner peak memory: full over LoRA", full["peak_rss_mb"] / lo["peak_rss_mb"],
                       "lora", "full", "full fine-tuning's peak RSS rise over a step over LoRA's (optimizer state "
                       "and gradients of the trained weights)"),
        headline_entry(f"weight push bytes: full over LoRA adapter-only (rank {rank})",
                       full["push_bytes"] / lo["push_bytes"], "lora", "full",
                       "the full model's push bytes over the LoRA learner's into the HF generator holding its "
                       "adapters (A and B alone)", target=5.0, merged_ratio=full["push_bytes"] / lo["merged_push_bytes"]),
        headline_entry(f"weight push time: full over LoRA adapter-only (rank {rank})", full["push_ms"] / lo["push_ms"],
                       "lora", "full", "the full model's push ms over the LoRA learner's adapter-only push",
                       target=3.0, merged_ratio=full["push_ms"] / lo["merged_push_ms"]),
        headline_entry("decode with the adapters active over merged weights", lo["decode_tok_s"] / lo["merged_decode_tok_s"],
                       "lora", "lora merged", "the HF generator's greedy decode tokens/s with peft's adapters "
                       "active over the same model merged (the price of adapter-only pushes)"),
        headline_entry("learner step time: full over LoRA", full["step_ms"] / lo["step_ms"], "lora", "full",
                       "full fine-tuning's step ms over LoRA's on the same batch"),
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m memr1.bench.lora", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a random 4-layer model, 1 round")
    p.add_argument("--rounds", type=int, default=None, help="rounds over the two sides, alternating (default 3)")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--pushes", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument("--worker", nargs=3, metavar=("IMPL", "MODEL", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        impl, model, out = args.worker
        worker(impl, model, args.rank, args.steps, args.pushes, out)
        return 0
    rounds = args.rounds or (1 if args.quick else 3)
    runs = {impl: [] for impl in IMPLS}
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as tmp:
        model = model_path(args.quick, os.path.join(tmp, "model"))
        for r in range(rounds):
            for impl in IMPLS if r % 2 == 0 else IMPLS[::-1]:
                out = os.path.join(tmp, f"{impl}-{r}.json")
                subprocess.run([sys.executable, "-m", "memr1.bench.lora", "--worker", impl, model, out,
                                "--rank", str(args.rank), "--steps", str(args.steps), "--pushes", str(args.pushes)],
                               check=True)
                with open(out) as f:
                    runs[impl].append(json.load(f))
                print(f"round {r + 1}/{rounds} {impl}: {runs[impl][-1]}", flush=True)
    rows = []
    for impl, got in runs.items():
        row = {"impl": impl, "rounds": len(got), "model": "random-4-layer" if args.quick else "smollm2-135m"}
        for key in ("peak_rss_mb", "step_ms", "push_ms", "decode_tok_s", "merged_push_ms", "merged_decode_tok_s"):
            if key in got[0]:
                row[key] = statistics.median(g[key] for g in got)
                row[key + "_runs"] = [round(g[key], 2) for g in got]
        row.update({k: got[0][k] for k in ("push_bytes", "merged_push_bytes", "trainable_params", "total_params",
                                           "adapter_bytes") if k in got[0]})
        rows.append(row)
    heads = headline(rows, args.rank)
    for h in heads:
        print(f"headline {h['name']}: {h['value']:.2f}")
    if args.json:
        from memr1.bench.common import write_json
        write_json(args.json, "lora", rows, headline=heads, settings={
            "quick": args.quick, "rounds": rounds, "rank": args.rank, "alpha": 2.0 * args.rank, "targets": TARGETS,
            "steps": args.steps, "pushes": args.pushes, "batch": "8 groups x 4 responses x 64 tokens, 256-token prompts",
            "generator": "hf, float32"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
