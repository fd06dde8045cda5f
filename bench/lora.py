"""LoRA in the learner against full fine-tuning: peak memory, step time, and the weight push.

    python -m memr1.bench.lora [--quick] [--rounds N] [--rank 16] --json PATH

Each side runs in a fresh process (`--worker`), the sides alternating over rounds: a Learner on the
model (default: SmolLM2-135M-Instruct, configs/default.toml's; --quick: a random 4-layer Llama with
SmolLM2's tokenizer), with every layer trained and no activation checkpointing, `--steps` GRPO steps
on the same synthetic batch (8 groups of 4 responses of 64 tokens after a 256-token prompt), then
`--pushes` pushes of its weights into a transformers generator of the same model. Rows are medians
over rounds of:
- peak_rss_mb: the rise of the process's peak RSS (VmHWM) over its RSS after the learner was built and
  before the first step, so the optimizer state and the gradients are in it and the model is not;
- step_ms, push_ms and push_bytes (what push_weights exported);
- trainable_params, and for LoRA adapter_bytes: the bytes of A and B, what an adapter-only push would
  move if the generator took one (neither backend here does: the LoRA push sends merged weights).
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
    from memr1.engine.generation.weights import push_weights
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
    gen = make_generator(GeneratorConfig(backend="hf", model=model, dtype="float32", max_model_len=1024))
    push, pushed = [], 0
    for v in range(pushes):
        t0 = time.perf_counter()
        pushed = push_weights(learner, gen, v + 1)
        push.append(time.perf_counter() - t0)
    adapter = sum(p.numel() * p.element_size() for n, p in learner.policy.lm.named_parameters()
                  if ".lora_A." in n or ".lora_B." in n)
    with open(out, "w") as f:
        json.dump({"impl": impl, "peak_rss_mb": peak, "step_ms": statistics.median(times[1:] or times) * 1e3,
                   "push_ms": statistics.median(push[1:] or push) * 1e3, "push_bytes": pushed,
                   "trainable_params": learner.trainable_params, "total_params": learner.total_params,
                   "adapter_bytes": adapter if impl == "lora" else None}, f)


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
        headline_entry(f"weight push bytes: full over LoRA (rank {rank})", full["push_bytes"] / lo["push_bytes"],
                       "lora", "full", "the full model's push bytes over the LoRA learner's (merged weights: "
                       "the generators here take no adapter-only update)", target=5.0,
                       adapter_only_bytes=lo["adapter_bytes"]),
        headline_entry(f"weight push time: full over LoRA (rank {rank})", full["push_ms"] / lo["push_ms"],
                       "lora", "full", "the full model's push ms over the LoRA learner's (its merge included)",
                       target=3.0),
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
        for key in ("peak_rss_mb", "step_ms", "push_ms"):
            row[key] = statistics.median(g[key] for g in got)
            row[key + "_runs"] = [round(g[key], 2) for g in got]
        row.update({k: got[0][k] for k in ("push_bytes", "trainable_params", "total_params", "adapter_bytes")})
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
