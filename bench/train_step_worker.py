"""One trainer of bench.train_step in its own process, so that its memory is its own.

    python -m memr1.bench.train_step_worker --trainer memr1|memr1_noshare|trl|trl_compact --batch B.pt --model M

It loads the batch the parent saved, sets its trainer up, then answers on stdout (lines starting with
"BENCH ", JSON after it; anything else a library prints there is ignored by the parent):
- at start: {"baseline_rss_mb", "setup_peak_mb", "positions", "micro_batches", "info"}; the process's
  peak RSS is reset after this, so the peak at the end is the peak of the steps alone;
- each "step" read on stdin: {"wall_s", "cpu_s", "loss", "grad_norm", "head_positions"} of one full
  optimizer step (head_positions: the positions its LM head scored, counted in TRL's head);
- "quit": {"step_peak_mb", "rss_mb"}, then it exits.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

from memr1.bench.common import status_mb

PROTOCOL = "BENCH "


def reset_peak() -> bool:
    """Set VmHWM back to the current RSS (Linux: write 5 to clear_refs); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def say(obj: dict) -> None:
    sys.stdout.write(PROTOCOL + json.dumps(obj) + "\n")
    sys.stdout.flush()


class Memr1:
    """memr1's Learner.train_step on the batch as Groups; `share` False: each sequence its own prompt."""

    def __init__(self, model, batch, share: bool, checkpointing: bool):
        from memr1.engine.training.config import LearnerConfig
        from memr1.engine.training.learner import Learner
        from memr1.rl.algos.config import LossConfig
        from memr1.rl.records import Credit, Group, TrainBatch
        s = batch["settings"]
        loss = LossConfig(aggregation="token-mean", clip_low=s["clip"], clip_high=s["clip"],
                          dual_clip=0.0,  # TRL has no dual clip (its `delta` is off by default)
                          kl_coef=0.0, entropy_coef=0.0)
        # anchor "behaviour": the ratio is taken against the given old log-probs, as TRL does with
        # `old_per_token_logps`; the rows layout (prefix attention over SDPA) is what memr1 runs on CPU.
        cfg = LearnerConfig(grad_clip=s["grad_clip"], micro_batch_tokens=s["micro_batch_tokens"], attn_impl="sdpa",
                            layout="rows", share_prefix=share, pad_bucket=s["pad_bucket"], anchor="behaviour",
                            activation_checkpointing=checkpointing, loss=loss)
        self.learner = Learner(cfg, model, lr=s["lr"])
        ids, adv, old, p, g = batch["ids"], batch["adv"], batch["old_logp"], s["prompt"], s["group_size"]
        self.batch = TrainBatch([
            Group(ids[i, :p].tolist(), ids[i:i + g, p:].tolist(), old[i:i + g].tolist(), [0.0] * g,
                  credit=[Credit("target", weight=a) for a in adv[i:i + g].tolist()])
            for i in range(0, ids.shape[0], g)])
        # What the forwards compute: every micro-batch's rows x width, padding included.
        micros = [m for m in self.learner.plan(self.batch).micros if not m.dummy]
        self.positions = sum(m.input_ids.numel() for m in micros)
        self.head_positions = sum(m.targets.numel() for m in micros)  # response positions only
        self.micro_batches = len(micros)
        self.info = {"optimizer": type(self.learner.optim).__name__,
                     "optimizer_fused": self.learner.optim.defaults.get("fused"),
                     "micro_rows": [list(m.input_ids.shape) for m in micros]}

    def step(self):
        m = self.learner.train_step(self.batch)
        return m["loss"], m["grad_norm"]


class Trl:
    """TRL's GRPOTrainer loss path as its trainer runs it: `compute_loss` per micro-batch,
    `accelerator.backward`, clip, optimizer and scheduler step. Micro-batch inputs are built before
    the timer (TRL builds them while generating, outside its loss path).

    `compact`: TRL patched to do memr1's head arithmetic. Its fused LM head scores only completion
    positions on Triton devices and every position elsewhere (CPU included), and it also computes the
    entropy, which its loss reads only for the entropy mask and bonus (both off here) and a logged
    metric. Compact forces the completion-only choice and a head without entropy (the metric then
    averages zeros), so that it and memr1_noshare do the same arithmetic."""

    def __init__(self, model, batch, checkpointing: bool, scratch: str, compact: bool = False):
        from memr1.bench.trl_stubs import prompt_dataset, stub_missing_trl_imports
        self.stubbed = stub_missing_trl_imports()
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from trl import GRPOConfig, GRPOTrainer
        s = batch["settings"]
        ids, adv, old, p, g = batch["ids"], batch["adv"], batch["old_logp"], s["prompt"], s["group_size"]
        n, micro = ids.shape[0], s["micro_seqs"]
        accum = n // micro
        lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, attn_implementation="sdpa")
        # dapo: every micro-batch's loss is its token sum over the whole step's token count, so the
        # micro-batch losses add up to the token mean over the step (memr1's token-mean).
        # TRL wants an output folder; it goes in the parent's temporary one, which is removed with it.
        args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="trl-", dir=scratch), use_cpu=True, bf16=False, fp16=False,
                          gradient_checkpointing=checkpointing, num_generations=g, per_device_train_batch_size=micro,
                          gradient_accumulation_steps=accum, beta=0.0, loss_type="dapo", learning_rate=s["lr"],
                          epsilon=s["clip"], max_grad_norm=s["grad_clip"], max_completion_length=ids.shape[1] - p,
                          weight_decay=0.0, report_to=[], lr_scheduler_type="constant", logging_steps=1_000_000)
        self.trainer = GRPOTrainer(model=lm, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                                   args=args, train_dataset=prompt_dataset(n, self.stubbed),
                                   processing_class=AutoTokenizer.from_pretrained(model))
        tr = self.trainer
        if compact:
            compact_head(tr)
        self.head = count_head_rows()
        self.head_positions = None  # measured by each step
        tr.create_optimizer_and_scheduler(num_training_steps=1000)
        if checkpointing:  # Trainer.train() turns this on; the timed path calls the loss directly
            tr.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        tr.model.train()
        tr.current_gradient_accumulation_steps = accum
        num_items = torch.tensor(float(n * (ids.shape[1] - p)))  # completion tokens of the whole step
        self.micros = []
        for a in range(0, n, micro):
            pi, ci = ids[a:a + micro, :p], ids[a:a + micro, p:]
            self.micros.append({"prompt_ids": pi, "prompt_mask": torch.ones_like(pi), "completion_ids": ci,
                                "completion_mask": torch.ones_like(ci), "advantages": adv[a:a + micro],
                                "old_per_token_logps": old[a:a + micro], "num_items_in_batch": num_items})
        self.positions = ids.numel()
        self.micro_batches = len(self.micros)
        self.info = {"optimizer": type(tr.optimizer).__name__, "optimizer_fused": tr.optimizer.defaults.get("fused"),
                     "optim_arg": str(args.optim), "steps_per_generation": args.steps_per_generation,
                     "trl_stubs": self.stubbed, "micro_rows": [list(ids[a:a + micro].shape) for a in range(0, n, micro)]}

    def step(self):
        tr = self.trainer
        total = 0.0
        self.head.rows = 0
        for inputs in self.micros:
            loss = tr.compute_loss(tr.model, inputs)
            tr.accelerator.backward(loss)
            total += float(loss.detach())
        norm = tr.accelerator.clip_grad_norm_(tr.model.parameters(), tr.args.max_grad_norm)
        tr.optimizer.step()
        tr.lr_scheduler.step()
        tr.optimizer.zero_grad(set_to_none=True)
        self.head_positions = self.head.rows
        return total, float(norm)


def count_head_rows():
    """Count the positions TRL's fused LM head scores (rows fed to its chunked log-prob function)."""
    from trl.trainer import utils as trl_utils
    function = trl_utils._ChunkedLogProbFunction

    class Counter:
        rows = 0

        @staticmethod
        def apply(hidden, *rest):
            Counter.rows += hidden.shape[0]
            return function.apply(hidden, *rest)
    trl_utils._ChunkedLogProbFunction = Counter
    return Counter


def compact_head(trainer) -> None:
    """Patch one GRPOTrainer (and TRL's head choice in this worker process) as Trl's `compact` says."""
    from trl.trainer import utils as trl_utils
    trl_utils._use_triton = lambda device: True  # the head's choice only; the kernel keeps its CPU path
    trl_utils.add_fused_lm_head(trainer.model, temperature=trainer.temperature,
                                cast_lm_head_to_fp32=trainer.args.cast_lm_head_to_fp32, outputs=("log_probs",))
    full = trainer._get_per_token_logps_and_entropies

    def without_entropy(*args, **kwargs):
        logps, _, aux = full(*args, **{**kwargs, "compute_entropy": False})
        return logps, torch.zeros_like(logps), aux
    trainer._get_per_token_logps_and_entropies = without_entropy


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trainer", required=True, choices=["memr1", "memr1_noshare", "trl", "trl_compact"])
    ap.add_argument("--batch", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args()
    batch = torch.load(args.batch)
    if args.trainer.startswith("trl"):
        trainer = Trl(args.model, batch, args.activation_checkpointing, os.path.dirname(os.path.abspath(args.batch)),
                      compact=args.trainer == "trl_compact")
    else:
        trainer = Memr1(args.model, batch, args.trainer == "memr1", args.activation_checkpointing)
    baseline, setup_peak = status_mb("VmRSS"), status_mb("VmHWM")
    reset = reset_peak()
    say({"baseline_rss_mb": baseline, "setup_peak_mb": setup_peak, "peak_reset": reset,
         "positions": trainer.positions,
         "micro_batches": trainer.micro_batches, "info": trainer.info,
         "torch_threads": torch.get_num_threads()})
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "step":
            t0, c0 = time.perf_counter(), time.process_time()
            loss, norm = trainer.step()
            say({"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                 "loss": loss, "grad_norm": norm, "head_positions": trainer.head_positions})
        elif cmd == "quit":
            say({"step_peak_mb": status_mb("VmHWM"), "rss_mb": status_mb("VmRSS")})
            return


if __name__ == "__main__":
    from memr1.engine.preload import preload

    preload()  # a no-op when the parent already preloaded (the environment says so)
    main()
