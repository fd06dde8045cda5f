"""One GRPO learner step (forward, backward, clip, AdamW) on SmolLM2-135M: memr1 vs TRL's GRPOTrainer.

    python -m memr1.bench.train_step [--quick] [--group-sizes 4,8,16] [--steps 5] --json PATH

Trainers: `memr1` (Learner.train_step, prompt sharing on: a group's prompt is computed once, in one row
with all its responses), `memr1_noshare` (the same Learner with share_prefix off: every completion in
its own row with its own copy of the prompt), `trl` (TRL 1.16 GRPOTrainer's loss path as its trainer
runs it: `compute_loss` per micro-batch, `accelerator.backward`, clip, optimizer and scheduler step)
and `trl_compact` (the same, patched to memr1's head arithmetic: off Triton devices TRL's fused LM head
scores every position and always computes the entropy; compact scores completion positions only and
skips the entropy, which this loss does not use; bench/train_step_worker.py). `head_positions` counts
the positions each trainer's LM head scores: memr1_noshare against trl_compact is the same arithmetic.

The work is the same on every side. A batch of N sequences (G completions per prompt, the group's
prompt shared) of random tokens, per-sequence advantages from U(-1, 2), and old log-probs (the
model's own, shifted by seeded noise so that some ratios clip) is saved once and loaded by every
trainer. Both configurations: fp32, sdpa attention, beta 0, no dropout (the model has none), clip 0.2 both sides
(memr1's dual clip off: TRL has none), the token mean over the whole step (TRL's "dapo" divides each
micro-batch's token sum by the step's completion tokens), lr 1e-6, grad clip 1, AdamW with weight
decay 0, a constant schedule, activation checkpointing on in both (--no-activation-checkpointing
turns it off in both).

Micro-batching is matched by positions per forward: TRL takes `micro_seqs` sequences per micro-batch,
i.e. micro_seqs x (prompt + response) positions; memr1's `micro_batch_tokens` is that same number.
Without sharing memr1's rows are then exactly TRL's micro-batches. With sharing a prompt counts once
against the budget, so the same budget holds more sequences and the step needs fewer forwards (a group
is never split: the shapes keep a whole group within the budget). `positions` is what the forwards of
one step compute, padding included (the shapes avoid padding); `tokens` is the batch's prompt +
response tokens, the same for every trainer. tokens_per_s = tokens / step_s (the same work done per
second); positions_per_s = positions / step_s (speed per computed position: memr1_noshare and trl
compute the same positions). memr1's timer also covers turning Groups into micro-batches; TRL's
covers only its loss path (its inputs are built while it generates).

Before timing, step 1 of every trainer is compared with TRL's: loss and pre-clip gradient norm must
agree to a relative 1e-4 (--tol), else the bench stops. Then `--steps` timed steps, alternating the
trainers round by round (A,B,C then B,C,A ...), each in its own worker process (bench/train_step_worker.py)
that holds its model between steps; median and min/max of wall and CPU seconds. Memory: `rss_rise_mb`
is the peak RSS over the steps minus the RSS right after setup; `peak_rss_mb` the whole process's peak.

The headline, per group size: memr1_noshare's tokens/s over trl_compact's (the same arithmetic: at
least 1 is the goal) and memr1's over trl's (goal 1.5), None where --trainers left a side out.

TRL is installed without its dependencies (`trl==1.16.0`, Makefile); see bench/trl_stubs.py.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch

from memr1.bench.train_step_worker import PROTOCOL

TRAINERS = ("memr1", "memr1_noshare", "trl", "trl_compact")
OLD_LOGP_NOISE = 0.1  # std of the shift: about 7% of ratios fall outside [0.8, 1.2]


def shapes(quick: bool) -> dict:
    # Quick: one micro-batch budget of 8 x 64 positions; full: 8 x 384. The largest group size keeps a
    # whole shared group (prompt + G responses) within the budget, and all widths are multiples of 32.
    if quick:
        return dict(seqs=16, prompt=32, response=32, micro_seqs=8, group_sizes=(4, 8))
    return dict(seqs=32, prompt=256, response=128, micro_seqs=8, group_sizes=(4, 8, 16))


def settings_for(s: dict, group_size: int, checkpointing: bool) -> dict:
    return dict(seqs=s["seqs"], prompt=s["prompt"], response=s["response"], group_size=group_size,
                micro_seqs=s["micro_seqs"], micro_batch_tokens=s["micro_seqs"] * (s["prompt"] + s["response"]),
                pad_bucket=32, lr=1e-6, clip=0.2, grad_clip=1.0, beta=0.0, dtype="float32", attn="sdpa",
                aggregation="token-mean / dapo", activation_checkpointing=checkpointing,
                old_logp_noise=OLD_LOGP_NOISE)


def make_batch(lm, settings: dict) -> dict:
    """Token ids [N, P+R] (each group's prompt repeated in its rows), advantages [N], old log-probs [N, R]."""
    n, p, r, g = settings["seqs"], settings["prompt"], settings["response"], settings["group_size"]
    gen = torch.Generator().manual_seed(g)
    vocab = lm.config.vocab_size
    prompts = torch.randint(0, vocab, (n // g, p), generator=gen).repeat_interleave(g, 0)
    ids = torch.cat([prompts, torch.randint(0, vocab, (n, r), generator=gen)], 1)
    # Given advantages (Group.advantages; TRL's `advantages` input), both signs, not zero-sum per group:
    # group-normalised ones would make the step-1 loss a near-cancelling sum (~1e-4) whose relative
    # agreement measures rounding only. The work per step does not depend on their values.
    adv = torch.rand(n, generator=gen) * 3.0 - 1.0
    with torch.no_grad():
        logits = torch.cat([lm(ids[i:i + 4]).logits[:, p - 1:-1] for i in range(0, n, 4)])
        logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, p:, None])[..., 0]
    old = logp + OLD_LOGP_NOISE * torch.randn(logp.shape, generator=gen)
    return {"ids": ids, "adv": adv, "old_logp": old, "settings": settings}


class Worker:
    def __init__(self, trainer: str, batch_path: str, model: str, checkpointing: bool, log_dir: str):
        self.trainer = trainer
        self.log = open(os.path.join(log_dir, f"{trainer}.log"), "w+")
        cmd = [sys.executable, "-m", "memr1.bench.train_step_worker", "--trainer", trainer, "--batch", batch_path,
               "--model", model] + ([] if checkpointing else ["--no-activation-checkpointing"])
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
               "HF_HUB_DISABLE_TELEMETRY": "1", "TRANSFORMERS_OFFLINE": "1"}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, env=env)
        self.ready = self.read()

    def read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(PROTOCOL):
                return json.loads(line[len(PROTOCOL):])
        self.log.seek(0)
        tail = self.log.read()[-3000:]
        raise RuntimeError(f"{self.trainer} worker exited ({self.proc.wait()}):\n{tail}")

    def ask(self, cmd: str) -> dict:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def rel_diff(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def check_agreement(first: dict[str, dict], tol: float, ref: str = "trl") -> dict:
    """Step-1 loss and grad norm of every trainer against `ref`'s; AssertionError past `tol`."""
    out = {}
    for name, res in first.items():
        if name == ref:
            continue
        out[name] = {"loss": res["loss"], "ref_loss": first[ref]["loss"], "grad_norm": res["grad_norm"],
                     "ref_grad_norm": first[ref]["grad_norm"],
                     "loss_rel_diff": rel_diff(res["loss"], first[ref]["loss"]),
                     "grad_norm_rel_diff": rel_diff(res["grad_norm"], first[ref]["grad_norm"])}
        bad = {k: v for k, v in out[name].items() if k.endswith("rel_diff") and not v <= tol}
        if bad:
            raise AssertionError(f"step 1 of {name} disagrees with {ref} beyond {tol}: {out[name]}")
    return out


def spread(xs: list[float]) -> list[float]:
    return [min(xs), max(xs)]


def progress(res: dict, settings: dict, trainer: str, what: str) -> dict:
    """One line per step as it lands: a full-size run takes an hour on a small CPU machine."""
    print(f"  G={settings['group_size']} {trainer:<14} {what}: {res['wall_s']:.1f} s wall, {res['cpu_s']:.1f} s CPU",
          flush=True)
    return res


def run_group_size(args, trainers: list[str], settings: dict, path: str, tmp: str) -> tuple[list[dict], dict]:
    workers = {}
    try:
        for t in trainers:  # one at a time: loading in parallel would skew every setup peak
            workers[t] = Worker(t, path, args.model, args.activation_checkpointing, tmp)
        first = {t: progress(w.ask("step"), settings, t, "step 1 (checked, untimed)") for t, w in workers.items()}
        agreement = check_agreement(first, args.tol) if "trl" in first and args.tol >= 0 else {}
        times = {t: [] for t in trainers}
        for i in range(args.steps):
            order = trainers[i % len(trainers):] + trainers[:i % len(trainers)]
            for t in order:
                times[t].append(progress(workers[t].ask("step"), settings, t, f"timed step {i + 1}/{args.steps}"))
        final = {t: w.ask("quit") for t, w in workers.items()}
    finally:
        for w in workers.values():
            w.close()
    tokens = settings["seqs"] * (settings["prompt"] + settings["response"])
    rows = []
    for t in trainers:
        ready, wall, cpu = workers[t].ready, [x["wall_s"] for x in times[t]], [x["cpu_s"] for x in times[t]]
        step_s, cpu_s = statistics.median(wall), statistics.median(cpu)
        rows.append({"trainer": t, "group_size": settings["group_size"], "tokens_per_s": tokens / step_s,
                     "positions": ready["positions"], "positions_per_s": ready["positions"] / step_s,
                     "head_positions": first[t]["head_positions"],
                     "step_s": step_s, "step_s_spread": spread(wall), "cpu_s": cpu_s, "cpu_s_spread": spread(cpu),
                     "peak_rss_mb": max(ready["setup_peak_mb"], final[t]["step_peak_mb"]),
                     "rss_rise_mb": final[t]["step_peak_mb"] - ready["baseline_rss_mb"],
                     "baseline_rss_mb": ready["baseline_rss_mb"], "peak_reset": ready["peak_reset"],
                     "tokens": tokens, "sequences": settings["seqs"], "micro_batches": ready["micro_batches"],
                     "steps_timed": len(wall), "step1_loss": first[t]["loss"], "step1_grad_norm": first[t]["grad_norm"],
                     "info": ready["info"]})
    by = {r["trainer"]: r for r in rows}
    for ref in ("trl", "trl_compact"):  # above 1: faster than TRL on this batch (wall, and CPU seconds)
        if ref in by:
            for r in rows:
                r[f"speedup_vs_{ref}"] = by[ref]["step_s"] / r["step_s"]
                r[f"cpu_speedup_vs_{ref}"] = by[ref]["cpu_s"] / r["cpu_s"]
    return rows, agreement


# (ours, baseline, target, what): the headline's pairs and their targets.
PAIRS = (("memr1_noshare", "trl_compact", 1.0, "the same batch and the same arithmetic: every sequence its own "
          "row, the LM head on completion positions only"),
         ("memr1", "trl", 1.5, "the same batch, each trainer as it ships: memr1 shares each group's prompt"))


def headline(rows: list[dict]) -> list[dict]:
    """Per group size, each pair's tokens_per_s ratio (above 1: memr1 is faster), with both sides'
    head_positions; None where a trainer did not run."""
    from memr1.bench.common import headline_entry

    out = []
    for g in dict.fromkeys(r["group_size"] for r in rows):
        by = {r["trainer"]: r for r in rows if r["group_size"] == g}
        for ours, base, target, what in PAIRS:
            a, b = (by.get(t, {}).get("tokens_per_s") for t in (ours, base))
            heads = {f"{side}_head_positions": by[t]["head_positions"]
                     for side, t in (("ours", ours), ("baseline", base)) if "head_positions" in by.get(t, {})}
            out.append(headline_entry(f"G={g}: {ours} over {base}, tokens/s", a / b if a is not None and b else None,
                                      f"{ours} G={g}", f"{base} G={g}", f"{ours}'s tokens_per_s over {base}'s: {what}",
                                      target=target, **heads))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="16 sequences of 32 + 32 tokens, group sizes 4, 8")
    ap.add_argument("--json", default=None)
    ap.add_argument("--model", default=None, help="HF checkpoint folder (default: the converted SmolLM2)")
    ap.add_argument("--trainers", default=",".join(TRAINERS))
    ap.add_argument("--group-sizes", default=None, help="comma-separated (default 4,8,16; quick 4,8)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per trainer, after the checked step 1")
    ap.add_argument("--tol", type=float, default=1e-4, help="relative step-1 agreement with TRL (<0: skip)")
    ap.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction, default=True,
                    help="recompute blocks in backward, in both trainers (the default of both)")
    args = ap.parse_args()
    if args.model is None:
        from memr1.engine.generation.model import default_model_path
        args.model = str(default_model_path())
    s = shapes(args.quick)
    sizes = [int(x) for x in args.group_sizes.split(",")] if args.group_sizes else list(s["group_sizes"])
    trainers = args.trainers.split(",")
    for g in sizes:
        if s["seqs"] % g or s["prompt"] + g * s["response"] > s["micro_seqs"] * (s["prompt"] + s["response"]):
            raise SystemExit(f"group size {g}: it must divide {s['seqs']} sequences, and a shared group must fit "
                             f"one micro-batch budget")
    settings = {g: settings_for(s, g, args.activation_checkpointing) for g in sizes}
    rows, agreement = [], {}
    with tempfile.TemporaryDirectory(prefix="train-step-bench-") as tmp:
        from transformers import AutoModelForCausalLM
        lm = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa")
        for g in sizes:
            torch.save(make_batch(lm, settings[g]), os.path.join(tmp, f"batch_g{g}.pt"))
        del lm  # the parent holds no model while the workers run
        for g in sizes:
            got, agreement[g] = run_group_size(args, trainers, settings[g], os.path.join(tmp, f"batch_g{g}.pt"), tmp)
            rows += got
            for name, a in agreement[g].items():
                print(f"G={g} step 1 {name} vs trl: loss rel diff {a['loss_rel_diff']:.2e}, "
                      f"grad norm rel diff {a['grad_norm_rel_diff']:.2e}", flush=True)
    from memr1.bench.common import print_table, write_json
    print_table(rows, ["trainer", "group_size", "tokens_per_s", "positions", "head_positions", "step_s", "cpu_s",
                       "speedup_vs_trl", "speedup_vs_trl_compact", "cpu_speedup_vs_trl", "peak_rss_mb", "rss_rise_mb"])
    if args.json:
        write_json(args.json, "train_step", rows, headline=headline(rows), model=args.model, quick=args.quick,
                   agreement=agreement, settings={str(g): v for g, v in settings.items()}, tol=args.tol,
                   steps=args.steps)


if __name__ == "__main__":
    from memr1.engine.preload import preload

    preload()  # tcmalloc + Intel OpenMP, as in production runs (engine/preload.py)
    main()
