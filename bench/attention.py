"""Prefix attention against a dense-mask SDPA on the same shared rows: one forward + backward of SmolLM2-135M.

    python -m memr1.bench.attention [--quick] [--group-sizes 4,8,16] [--rounds 5] --json PATH

memr1's rows layout holds a group's prompt once and then its G responses (engine/training/batching.py);
each response attends to the prompt and to itself. `dense_mask` is what a competent transformers user
writes for such a row: sdpa attention with a [1, 1, L, L] boolean mask (causal, the prompt visible to
every response, the responses blind to each other), over which SDPA computes all L² pairs. `memr1_prefix`
is engine/training/prefix_attention.py on the same row: the prompt causally, then the responses batched
against the prompt's keys and their own. This isolates the attention: bench.train_step's `memr1` row is
prompt sharing and this attention together. The other competent choice, flex_attention with a block mask,
has no row: torch has no FlexAttention backward on CPU ("FlexAttention does not support backward on
CPU").

Both sides run the same weights, token ids, positions and loss (the mean square of the final hidden
states at the response positions, so that every position's gradient flows), forward and backward, fp32,
no activation checkpointing. Building each side's attention input (the dense mask; the PrefixLayout) is
timed apart as `build_ms`, outside the step timer. Before timing, hidden states and input-embedding
gradients must agree to a relative --tol, else the bench stops. Rounds alternate the order (A,B then
B,A); rows give the median and spread over --rounds. The headline: per group size, dense_mask's median
step_s over memr1_prefix's.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from memr1.engine.training import prefix_attention
from memr1.engine.training.batching import Seq, build_micro

IMPLS = ("dense_mask", "memr1_prefix")


def shapes(quick: bool) -> dict:
    return dict(prompt=32, response=16, group_sizes=(4, 8)) if quick else \
        dict(prompt=256, response=128, group_sizes=(4, 8, 16))


def dense_mask(micro, p: int, lengths: list[int]) -> torch.Tensor:
    """The [1, 1, L, L] mask of one shared row: causal; a response sees the prompt and itself; padding itself."""
    width = micro.input_ids.shape[1]
    seg = torch.full((width,), -1)
    seg[:p], start = 0, p
    for j, r in enumerate(lengths):
        seg[start:start + r], start = j + 1, start + r
    q, k = seg[:, None], seg[None, :]
    mask = torch.ones(width, width, dtype=torch.bool).tril() & (k >= 0) & ((k == 0) | (k == q))
    return (mask | torch.eye(width, dtype=torch.bool))[None, None]


class Side:
    """One impl: its model (same weights as the other side's) and its attention keywords for the row."""

    def __init__(self, impl: str, model_path: str, group: int, s: dict):
        from transformers import AutoModelForCausalLM
        attn = "sdpa" if impl == "dense_mask" else prefix_attention.NAME
        self.lm = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation=attn)
        self.lm.train()
        g = torch.Generator().manual_seed(group)
        prompt = torch.randint(0, self.lm.config.vocab_size, (s["prompt"],), generator=g)
        # Responses of slightly different lengths, as a sampled group has: the padded batch is exercised.
        lengths = [s["response"] - (j % 4) * s["response"] // 16 for j in range(group)]
        unit = [Seq(j, prompt, torch.randint(0, self.lm.config.vocab_size, (r,), generator=g), None)
                for j, r in enumerate(lengths)]
        self.micro = build_micro([unit], False, 64, torch.device("cpu"))
        width = self.micro.input_ids.shape[1]
        t = time.perf_counter()
        self.attn = ({"attention_mask": dense_mask(self.micro, s["prompt"], lengths)} if impl == "dense_mask" else
                     {"prefix": prefix_attention.layout([(s["prompt"], lengths)], width, torch.device("cpu"))})
        self.build_ms = 1e3 * (time.perf_counter() - t)
        self.width, self.positions = width, s["prompt"] + sum(lengths)

    def step(self):
        """Forward + backward; the final hidden states at response positions and the embedding gradient."""
        self.lm.zero_grad(set_to_none=True)
        base = self.lm.model
        hidden = base(input_ids=self.micro.input_ids, position_ids=self.micro.position_ids, use_cache=False,
                      **self.attn).last_hidden_state
        out = hidden.reshape(-1, hidden.shape[-1])[self.micro.index]
        out.square().mean().backward()
        return out.detach(), base.embed_tokens.weight.grad


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def bench_group(model_path: str, group: int, s: dict, rounds: int, tol: float) -> list[dict]:
    sides = {impl: Side(impl, model_path, group, s) for impl in IMPLS}
    (h_a, g_a), (h_b, g_b) = (sides[i].step() for i in IMPLS)
    agree = {"hidden_rel_diff": rel(h_b, h_a), "grad_rel_diff": rel(g_b, g_a)}
    print(f"G={group}: memr1_prefix vs dense_mask hidden {agree['hidden_rel_diff']:.2e}, "
          f"embedding grad {agree['grad_rel_diff']:.2e}", flush=True)
    if tol >= 0 and max(agree.values()) > tol:
        raise SystemExit(f"G={group}: the two attentions disagree beyond --tol {tol}: {agree}")
    wall = {i: [] for i in IMPLS}
    for r in range(rounds):
        for impl in (IMPLS if r % 2 == 0 else IMPLS[::-1]):
            t = time.perf_counter()
            sides[impl].step()
            wall[impl].append(time.perf_counter() - t)
    rows = []
    for impl in IMPLS:
        side = sides[impl]
        rows.append({"impl": impl, "group_size": group, "prompt_len": s["prompt"], "response_len": s["response"],
                     "row_width": side.width, "positions": side.positions, "rounds": rounds,
                     "step_s": statistics.median(wall[impl]), "step_s_spread": [min(wall[impl]), max(wall[impl])],
                     "build_ms": side.build_ms, **agree})
    base = rows[0]["step_s"]
    for r in rows:
        r["speedup_vs_dense"] = base / r["step_s"]
    return rows


def headline(rows: list[dict]) -> list[dict]:
    """Per group size, dense_mask's median step_s over memr1_prefix's (above 1: the prefix attention is
    faster); None where a side is missing or took no time."""
    from memr1.bench.common import headline_entry

    out = []
    for g in dict.fromkeys(r["group_size"] for r in rows):
        by = {r["impl"]: r.get("step_s") for r in rows if r["group_size"] == g}
        dense, prefix = by.get("dense_mask"), by.get("memr1_prefix")
        out.append(headline_entry(
            f"G={g}: dense_mask over memr1_prefix, step_s", dense / prefix if dense is not None and prefix else None,
            f"memr1_prefix G={g}", f"dense_mask G={g}", "dense_mask's median step_s over memr1_prefix's: one "
            "forward + backward of the same shared row, fp32"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="prompt 32, responses 16, group sizes 4, 8")
    ap.add_argument("--json", default=None)
    ap.add_argument("--model", default=None, help="HF checkpoint folder (default: the converted SmolLM2)")
    ap.add_argument("--group-sizes", default=None, help="comma-separated (default 4,8,16; quick 4,8)")
    ap.add_argument("--rounds", type=int, default=5, help="timed steps per impl, alternating the order")
    ap.add_argument("--tol", type=float, default=1e-4, help="relative agreement before timing (<0: skip)")
    args = ap.parse_args()
    if args.model is None:
        from memr1.engine.generation.model import default_model_path
        args.model = str(default_model_path())
    s = shapes(args.quick)
    sizes = [int(x) for x in args.group_sizes.split(",")] if args.group_sizes else list(s["group_sizes"])
    rows = []
    for g in sizes:
        rows += bench_group(args.model, g, s, args.rounds, args.tol)
    from memr1.bench.common import print_table, write_json
    print_table(rows, ["impl", "group_size", "row_width", "positions", "step_s", "speedup_vs_dense", "build_ms",
                       "hidden_rel_diff", "grad_rel_diff"])
    if args.json:
        write_json(args.json, "attention", rows, headline=headline(rows), model=args.model, quick=args.quick,
                   shapes=s, rounds=args.rounds, tol=args.tol, threads=torch.get_num_threads())


if __name__ == "__main__":
    from memr1.engine.preload import preload

    preload()  # tcmalloc + Intel OpenMP, as in production runs (engine/preload.py)
    main()
