"""Synchronous vs asynchronous training: the same small config at max_staleness 0 and 1.

    python -m memr1.bench.loop [--quick] --json PATH

Rows: max_staleness, step_s (wall seconds per step, after a warm-up step), gen_s, train_s, sync_s
(moving weights), sync_wait_s (waiting for an in-flight generate call before moving them), idle_frac
(the share of the learner's time spent waiting for rollouts). The model is a small random
Llama with SmolLM2's tokenizer on the HF backend, the stage is the Answer Agent stage on synthetic data;
both runs share every setting but the staleness bound.
"""
import argparse
import statistics
import tempfile
import time
from pathlib import Path


from memr1.bench.common import print_table, random_llama, write_json
from memr1.engine.generation import GeneratorConfig, make_generator
from memr1.engine.learner import Learner, LearnerConfig
from memr1.engine.loop import Loop, LoopConfig
from memr1.engine.preload import preload
from memr1.memory_store import HashEmbedder
from memr1.rl.agents import SamplingConfig
from memr1.rl.agents.answer import AnswerConfig
from memr1.rl.data import load_conversations
from memr1.rl.items import answer_items, oracle_bank
from memr1.rl.rewards import RewardConfig
from memr1.rl.stages import AnswerStage, StageConfig


def run(k: int, model: Path, items, steps: int, args) -> dict:
    gen = make_generator(GeneratorConfig(backend="hf", model=str(model), max_model_len=4096))
    learner = Learner(LearnerConfig(), str(model), lr=1e-5)
    stage = AnswerStage(items, HashEmbedder(64), StageConfig(prompts_per_step=args.prompts, group_size=4),
                        SamplingConfig(), AnswerConfig(top_k_per_speaker=10, max_new_tokens=args.new_tokens),
                        RewardConfig())
    metrics = []
    t = time.perf_counter()
    Loop(stage, gen, learner, LoopConfig(max_staleness=k), steps, metrics.append).run()
    wall = time.perf_counter() - t
    steady = metrics[1:]  # the first step pays warm-up in both modes
    mean = lambda key: statistics.fmean(m[key] for m in steady)
    step_s = statistics.fmean(m["step_s"] for m in steady)
    return {"max_staleness": k, "step_s": step_s, "gen_s": mean("gen_s"), "train_s": mean("train_s"),
            "sync_s": mean("sync_s"), "sync_wait_s": mean("sync_wait_s"), "idle_frac": mean("idle_s") / step_s, "steps": steps, "wall_s": wall}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    steps = 4 if args.quick else 8
    args.prompts, args.new_tokens = (4, 24) if args.quick else (8, 32)
    convs, embedder = load_conversations(None, n=10, split="train"), HashEmbedder(64)
    items = answer_items(convs, {c.sample_id: oracle_bank(None, c, embedder) for c in convs}, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        model = random_llama(tmp, layers=4, hidden=256, heads=8, kv_heads=4, ffn_mult=4)
        rows = [run(k, model, items, steps, args) for k in (0, 1)]
    print_table(rows, ["max_staleness", "step_s", "gen_s", "train_s", "sync_s", "sync_wait_s", "idle_frac", "steps"])
    print(f"  max_staleness 1 / 0 wall seconds per step = {rows[1]['step_s'] / rows[0]['step_s']:.2f}")
    write_json(args.json, "loop", rows)
    return 0


if __name__ == "__main__":
    preload()  # tcmalloc + Intel OpenMP, as in production runs (engine/preload.py)
    raise SystemExit(main())
