"""One GRPO learner step (forward, backward, clip, AdamW) on SmolLM2-135M: memr1 vs TRL's GRPOTrainer.

    python -m memr1.bench.train_step [--quick] --json PATH

Both trainers get identical tensors: G groups x 4 completions of (prompt + response) random tokens (the 4
completions of a group share their prompt, as in GRPO), fixed 0/1 rewards, the same group advantages, the
same micro-batch size in tokens (MICRO sequences' worth per backward; memr1 counts a shared prompt once),
activation checkpointing on in both (each trainer's default; --no-activation-checkpointing turns it off in both), token-mean
loss over the whole batch ("dapo" in TRL), beta 0, lr 1e-6, grad clip 1, fp32, sdpa attention. Each trainer
runs in its own subprocess so that its peak RSS is its own. TRL's loss path is timed the way its
trainer runs it: `compute_loss` per micro-batch, `accelerator.backward`, clip, the trainer's optimizer.

TRL is a bench-only dependency (`pip install --no-deps trl==1.16.0`). Its GRPO module imports pandas and
datasets (and through them pyarrow) at import time, for logging and dataset handling only; when
those are missing, the TRL
worker installs empty stand-in modules for them and the JSON records that in `trl_stubs`.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import types

import torch

GROUP = 4
MICRO = 8  # sequences per micro-batch


def shapes(quick: bool) -> dict:
    return dict(groups=2, prompt=64, response=32, steps=2) if quick else dict(groups=8, prompt=256, response=128, steps=2)


def fixed_batch(groups: int, prompt: int, response: int, vocab: int):
    g = torch.Generator().manual_seed(0)
    n = groups * GROUP
    # GRPO: the GROUP completions of one prompt share it.
    prompts = torch.randint(0, vocab, (groups, prompt), generator=g).repeat_interleave(GROUP, 0)
    ids = torch.cat([prompts, torch.randint(0, vocab, (n, response), generator=g)], 1)
    rewards = torch.randint(0, 2, (n,), generator=g).float()
    rewards[::GROUP] = 1.0 - rewards[1::GROUP]  # no all-equal group: every sequence carries gradient
    group_ids = torch.arange(n) // GROUP
    from memr1.kernels import grpo_advantage
    adv, _ = grpo_advantage(rewards, group_ids, groups, std="unbiased")
    return ids, adv


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def run_memr1(model: str, ids, adv, prompt: int, steps: int, checkpointing: bool):
    from memr1.engine.learner import Learner, LearnerConfig
    from memr1.rl.losses import LossConfig
    from memr1.rl.records import Group, TrainBatch
    learner = Learner(LearnerConfig(grad_clip=1.0, micro_batch_tokens=MICRO * ids.shape[1],
                                    loss=LossConfig(aggregation="token-mean"), activation_checkpointing=checkpointing),
                      model, lr=1e-6)
    groups = [Group(ids[i][:prompt].tolist(), ids[i:i + GROUP, prompt:].tolist(), None, [0.0] * GROUP,
                    advantages=adv[i:i + GROUP].tolist()) for i in range(0, len(ids), GROUP)]
    batch = TrainBatch(groups)
    times = []
    for _ in range(steps + 1):  # the first step is warmup
        t0, c0 = time.perf_counter(), time.process_time()
        learner.train_step(batch)
        times.append((time.perf_counter() - t0, time.process_time() - c0))
    return times[1:]


class _Stub(types.ModuleType):
    """A module whose every attribute is a fresh empty class: enough for imports and isinstance checks."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {})
        setattr(self, name, value)
        return value


def stub_missing_trl_imports() -> list[str]:
    """Empty stand-ins for modules TRL's GRPO file imports but the timed loss path never uses."""
    import importlib.machinery
    import importlib.util
    stubbed = []
    for top, subs in (("pandas", ()), ("datasets", ("fingerprint",)), ("pyarrow", ("compute", "types"))):
        if importlib.util.find_spec(top) is not None:
            continue
        for name in (top, *(f"{top}.{sub}" for sub in subs)):
            sys.modules[name] = _Stub(name)
            sys.modules[name].__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            sys.modules[name].__path__ = []
            sys.modules[name].__version__ = "0"
        for sub in subs:
            setattr(sys.modules[top], sub, sys.modules[f"{top}.{sub}"])
        stubbed.append(top)
    return stubbed


def prompt_dataset(n: int, stubbed: list[str]):
    """The trainer wants a dataset of prompts; the timed path never reads it."""
    import datasets
    rows = [{"prompt": "x"}] * n
    if "datasets" not in stubbed:
        return datasets.Dataset.from_list(rows)

    class Rows(datasets.Dataset):
        column_names, cache_files = ["prompt"], []
        __len__ = lambda self: n
        __getitem__ = lambda self, i: rows[i]
    return Rows()


def run_trl(model: str, ids, adv, prompt: int, steps: int, checkpointing: bool):
    stubbed = stub_missing_trl_imports()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    n = ids.shape[0]
    accum = n // MICRO
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, attn_implementation="sdpa")
    args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="trl-bench-"), use_cpu=True, bf16=False, fp16=False,
                      gradient_checkpointing=checkpointing, num_generations=GROUP, per_device_train_batch_size=MICRO,
                      gradient_accumulation_steps=accum, beta=0.0, loss_type="dapo", learning_rate=1e-6,
                      max_grad_norm=1.0, max_completion_length=ids.shape[1] - prompt, report_to=[],
                      lr_scheduler_type="constant", logging_steps=1_000_000)
    trainer = GRPOTrainer(model=lm, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                          args=args, train_dataset=prompt_dataset(n, stubbed),
                          processing_class=AutoTokenizer.from_pretrained(model))
    trainer.create_optimizer_and_scheduler(num_training_steps=steps + 1)
    if checkpointing:  # Trainer.train() turns this on; the timed path calls the loss directly, so do it here
        trainer.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = accum
    num_items = torch.tensor(float(n * (ids.shape[1] - prompt)))
    micros = []
    for s in range(0, n, MICRO):
        p, c = ids[s:s + MICRO, :prompt], ids[s:s + MICRO, prompt:]
        micros.append({"prompt_ids": p, "prompt_mask": torch.ones_like(p), "completion_ids": c,
                       "completion_mask": torch.ones_like(c), "advantages": adv[s:s + MICRO],
                       "num_items_in_batch": num_items})
    times = []
    for _ in range(steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        for inputs in micros:
            loss = trainer.compute_loss(trainer.model, inputs)
            trainer.accelerator.backward(loss)
        trainer.accelerator.clip_grad_norm_(trainer.model.parameters(), args.max_grad_norm)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        times.append((time.perf_counter() - t0, time.process_time() - c0))
    return times[1:], stubbed


def worker(args):
    s = shapes(args.quick)
    from transformers import AutoConfig
    vocab = AutoConfig.from_pretrained(args.model).vocab_size
    ids, adv = fixed_batch(s["groups"], s["prompt"], s["response"], vocab)
    stubbed = []
    if args.worker == "memr1":
        times = run_memr1(args.model, ids, adv, s["prompt"], s["steps"], args.activation_checkpointing)
    else:
        times, stubbed = run_trl(args.model, ids, adv, s["prompt"], s["steps"], args.activation_checkpointing)
    step_s = statistics.median(t for t, _ in times)
    # CPU seconds of the process per step: on a shared machine this moves far less than wall time.
    cpu_s = statistics.median(c for _, c in times)
    row = {"trainer": args.worker, "algo": "grpo", "activation_checkpointing": args.activation_checkpointing,
           "tokens_per_s": ids.numel() / step_s, "step_s": step_s,
           "cpu_s": cpu_s, "tokens_per_cpu_s": ids.numel() / cpu_s,
           "peak_rss_mb": peak_rss_mb(), "sequences": ids.shape[0], "tokens": ids.numel(), "steps_timed": len(times)}
    with open(args.out, "w") as f:
        json.dump({"row": row, "trl_stubs": stubbed}, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 groups, 64 + 32 tokens: a smoke run")
    ap.add_argument("--json", default=None)
    ap.add_argument("--model", default=None, help="HF checkpoint folder (default: the converted SmolLM2)")
    ap.add_argument("--trainers", default="memr1,trl")
    ap.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction, default=True,
                    help="recompute blocks in backward, in both trainers (the default of both)")
    ap.add_argument("--worker", choices=["memr1", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.model is None:
        from memr1.engine.generation.model import default_model_path
        args.model = str(default_model_path())
    rows, notes = [], {}
    for trainer in args.trainers.split(","):
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            cmd = [sys.executable, "-m", "memr1.bench.train_step", "--worker", trainer, "--model", args.model,
                   "--out", out.name] + (["--quick"] if args.quick else []) + \
                  ([] if args.activation_checkpointing else ["--no-activation-checkpointing"])
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
                                       "HF_HUB_DISABLE_TELEMETRY": "1", "TRANSFORMERS_OFFLINE": "1"})
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                notes[f"{trainer}_error"] = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"
                continue
            result = json.load(open(out.name))
            rows.append(result["row"])
            if result["trl_stubs"]:
                notes["trl_stubs"] = result["trl_stubs"]
    by = {r["trainer"]: r for r in rows}
    if "memr1" in by and "trl" in by:
        notes["ratio_tokens_per_s"] = by["memr1"]["tokens_per_s"] / by["trl"]["tokens_per_s"]
        notes["ratio_tokens_per_cpu_s"] = by["memr1"]["tokens_per_cpu_s"] / by["trl"]["tokens_per_cpu_s"]
        notes["ratio_peak_rss"] = by["memr1"]["peak_rss_mb"] / by["trl"]["peak_rss_mb"]
    from memr1.bench.common import print_table, write_json
    if rows:
        print_table(rows, ["trainer", "algo", "tokens_per_s", "step_s", "cpu_s", "peak_rss_mb", "tokens"])
    for k, v in notes.items():
        print(f"{k}: {v}")
    if args.json:
        write_json(args.json, "train_step", rows, model=args.model, quick=args.quick, **notes)


if __name__ == "__main__":
    from memr1.engine.preload import preload

    preload()  # tcmalloc + Intel OpenMP, as in production runs (engine/preload.py)
    main()
