"""Synchronous vs asynchronous training: the same stage at max_staleness 0 and 1, in alternating legs.

    python -m memr1.bench.loop [--quick] [--rows tiny,smollm2] [--legs N] [--steps N] --json PATH

Rows (one per model row and staleness): step_s (median wall seconds per learner step), its spread, and
the balance that decides the result: gen_s (the rollout: prompts, generate, scoring), train_s, sync_s
(moving weights), sync_wait_s (waiting for an in-flight generate call before moving them), idle_s (the
learner waiting for a rollout), gen_train_ratio (gen_s / train_s). In async mode generation and training
share the cores, so its gen_s and train_s are contended; the sync row's ratio is the uncontended balance.
  tiny     a random 4-layer Llama (SmolLM2's tokenizer) on the HF backend, answer stage on synthetic data
  smollm2  SmolLM2-135M-Instruct with configs/default.toml's generator (vLLM where installed), embedder,
           learner and answer-stage shape (prompts per step, group size, token budget, lr)
Legs run staleness 0, 1, 1, 0, ... so drift over the run hits both modes alike. Every leg starts from the
base weights (a fresh learner, the generator reloaded) at step 0, so both modes see the same prompts; its
first step (warm-up) is not timed. The headline is `wall_per_step_s`: a leg's wall time from the start
of its second step's rollout to the end of its last step, over the steps after the first. Both modes
then hold the same work in the window, one rollout and one training step per timed step; it includes the
last step, which async mode has nothing left to overlap with (the pipeline drain that a stage of 5-15
steps pays). Starting the window at the end of the first step instead would leave out the rollout that
async mode overlaps with that step's training: with one timed step, the async leg would be timed on its
training alone. `step_s` is the median of the learner's own per-step times over the same steps."""
import argparse
import statistics
import tempfile
import time
from pathlib import Path

from memr1.bench.common import headline_entry, print_table, random_llama, write_json
from memr1.engine.preload import preload
from memr1.rl.task.stages.context import StageContext

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "default.toml"
ORDER = (0, 1, 1, 0)  # staleness of leg i is ORDER[i % 4]


class Setup:
    """What one model row needs to run legs: the stage, the generator, and how to make a fresh learner."""

    def __init__(self, name, stage, gen, make_learner, settings: dict):
        self.name, self.stage, self.gen, self.make_learner, self.settings = name, stage, gen, make_learner, settings


def tiny_setup(folder: str, quick: bool) -> Setup:
    from memr1.engine.generation import make_generator
    from memr1.engine.generation.config import GeneratorConfig
    from memr1.engine.training.config import LearnerConfig
    from memr1.engine.training.learner import Learner
    from memr1.memory_store import HashEmbedder
    from memr1.rl.task.agents.answer import AnswerConfig
    from memr1.rl.task.data import load_conversations
    from memr1.rl.task.train_items import answer_items, oracle_bank
    from memr1.rl.task.stages.calls import AnswerStage, StageConfig
    from memr1.rl.task.turns import Task

    # quick is a smoke run of the bench: fewer memories shorten its prompts, which TRL's full-vocabulary
    # logits over every position make the bulk of bench.e2e's quick time
    prompts, new_tokens, memories = (4, 24, 3) if quick else (8, 32, 10)
    model = random_llama(folder, layers=4, hidden=256, heads=8, kv_heads=4, ffn_mult=4)
    convs, embedder = load_conversations(None, n=10, split="train"), HashEmbedder(64)
    items = answer_items(convs, {c.sample_id: oracle_bank(None, c, embedder) for c in convs}, seed=0)
    gen = make_generator(GeneratorConfig(backend="hf", model=str(model), max_model_len=4096))
    answer = AnswerConfig(top_k_per_speaker=memories, max_new_tokens=new_tokens)
    stage = AnswerStage(items, StageContext(embedder, Task(answer=answer)),
                        StageConfig(prompts_per_step=prompts, group_size=4))
    settings = {"backend": "hf", "stage": "answer", "prompts_per_step": prompts, "group_size": 4,
                "max_new_tokens": new_tokens, "top_k_per_speaker": memories, "lr": 1e-5,
                "learner": "LearnerConfig() defaults"}
    return Setup("tiny-random", stage, gen, lambda: Learner(LearnerConfig(), str(model), lr=1e-5), settings)


def smollm2_setup(dtype: str | None = None) -> Setup:
    """`dtype`: the generator's, instead of the config's (bench.e2e pins fp32, as TRL's engine runs)."""
    import msgspec

    from memr1.engine.config.resolve import resolve
    from memr1.engine.config.run import load_config, make_embedder
    from memr1.engine.generation import make_generator
    from memr1.engine.training.learner import Learner
    from memr1.rl.task.data import load_configured
    from memr1.rl.task.train_items import answer_items, oracle_bank
    from memr1.rl.task.stages.calls import AnswerStage

    run = resolve(load_config(DEFAULT_CONFIG))
    cfg, scfg = run.cfg, run.stage("answer")
    embedder = make_embedder(cfg)
    convs = load_configured(cfg.data, "train")
    items = answer_items(convs, {c.sample_id: oracle_bank(None, c, embedder) for c in convs}, run.seed)
    gcfg = cfg.generator if dtype is None else msgspec.structs.replace(cfg.generator, dtype=dtype)
    gen = make_generator(gcfg, run.seed)
    stage = AnswerStage(items, StageContext(embedder, run.task, cfg.reward, run.rollout_sampling("answer")), scfg)
    backend = "vllm" if type(gen).__name__ == "VLLMGenerator" else "hf"  # generator.backend = "auto" picks one
    settings = {"backend": backend, "stage": "answer", "prompts_per_step": scfg.prompts_per_step,
                "group_size": scfg.group_size, "max_new_tokens": cfg.answer.max_new_tokens, "lr": scfg.lr,
                "config": str(DEFAULT_CONFIG), "embedder": cfg.embedder,
                "generator": msgspec.to_builtins(gcfg), "learner": msgspec.to_builtins(run.learner("answer"))}
    return Setup("SmolLM2-135M-Instruct", stage, gen,
                 lambda: Learner(run.learner("answer"), str(run.base_model), lr=scfg.lr,
                                 temperature=run.temperature("answer"), seed=run.seed), settings)


def run_leg(setup: Setup, staleness: int, steps: int) -> tuple[list[dict], float]:
    """One leg from the base weights: the per-step metrics of its timed steps (all but the first), and the
    wall seconds from the start of step 1's rollout to the end of the last step."""
    from memr1.engine.config.run import LoopConfig
    from memr1.engine.generation.weights import push_weights
    from memr1.engine.loop import Loop

    learner = setup.make_learner()
    push_weights(learner, setup.gen, 0)  # the base weights, version 0
    metrics, ends, starts = [], [], {}

    def record(m):
        metrics.append(m)
        ends.append(time.perf_counter())

    stage = setup.stage
    rollout = stage.rollout

    def timed_rollout(step, generator):  # the producer thread calls this; its start opens the window
        starts.setdefault(step, time.perf_counter())
        return rollout(step, generator)
    stage.rollout = timed_rollout
    try:
        Loop(stage, setup.gen, learner, LoopConfig(max_staleness=staleness, checkpoint_every=0), steps, record).run()
    finally:
        stage.rollout = rollout
    if len(metrics) != steps or any(m.get("skipped") for m in metrics):
        raise RuntimeError(f"leg at staleness {staleness} trained {len(metrics)} of {steps} steps")
    return metrics[1:], ends[-1] - starts[1]


def bench_row(setup: Setup, legs: int, timed: int) -> list[dict]:
    steps = {0: [], 1: []}
    walls = {0: [], 1: []}
    for leg in range(legs):
        k = ORDER[leg % len(ORDER)]
        print(f"  {setup.name}: leg {leg + 1}/{legs}, max_staleness {k}", flush=True)
        m, wall = run_leg(setup, k, timed + 1)
        steps[k] += m
        walls[k].append(wall / timed)
    rows = []
    for k in (0, 1):
        med = lambda key: statistics.median(m[key] for m in steps[k])  # noqa: E731
        step_s = [m["step_s"] for m in steps[k]]
        rows.append({"model": setup.name, "max_staleness": k, "legs": len(walls[k]), "steps_timed": len(step_s),
                     "step_s": statistics.median(step_s), "step_s_spread": [min(step_s), max(step_s)],
                     "gen_s": med("gen_s"), "train_s": med("train_s"), "sync_s": med("sync_s"),
                     "sync_wait_s": med("sync_wait_s"), "idle_s": med("idle_s"),
                     "idle_frac": med("idle_s") / statistics.median(step_s),
                     "gen_train_ratio": med("gen_s") / med("train_s"),
                     "response_tokens": med("response_tokens"), "wall_per_step_s": statistics.median(walls[k]),
                     "step_s_all": step_s, **setup.settings})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the tiny row only, 4 legs of 1 timed step, small batches")
    p.add_argument("--rows", default=None, help="tiny,smollm2 (default; --quick: tiny)")
    p.add_argument("--legs", type=int, default=None, help="legs, alternating staleness 0,1,1,0 (default 4)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per leg (default 5; --quick: 1)")
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    names = (args.rows or ("tiny" if args.quick else "tiny,smollm2")).split(",")
    legs, timed = args.legs or 4, args.steps or (1 if args.quick else 5)
    if bad := [n for n in names if n not in ("tiny", "smollm2")]:
        p.error(f"unknown rows {bad}")
    if legs < 2 or timed < 1:
        p.error("--legs must be >= 2 (both modes) and --steps >= 1")
    rows = []
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            setup = tiny_setup(tmp, args.quick) if name == "tiny" else smollm2_setup()
            rows += bench_row(setup, legs, timed)
            del setup
    print_table(rows, ["model", "max_staleness", "steps_timed", "step_s", "gen_s", "train_s", "sync_s", "sync_wait_s",
                       "idle_s", "gen_train_ratio"])
    head = []
    for name in dict.fromkeys(r["model"] for r in rows):
        sync, lag = (next(r for r in rows if r["model"] == name and r["max_staleness"] == k) for k in (0, 1))
        head.append(headline_entry(
            f"{name}: max_staleness 1 over 0, wall per step", sync["wall_per_step_s"] / lag["wall_per_step_s"],
            f"max_staleness 1 {name}", f"max_staleness 0 {name}", "max_staleness 0's wall seconds per step over 1's "
            "(a leg's wall time after its first step, drain included, over its steps)",
            step_s_ratio=sync["step_s"] / lag["step_s"], gen_train_ratio_sync=sync["gen_train_ratio"]))
        print(f"  {name}: max_staleness 0 / 1 wall seconds per step, drain included = {head[-1]['value']:.2f} "
              f"(median learner step {head[-1]['step_s_ratio']:.2f}; gen/train {sync['gen_train_ratio']:.2f} "
              "when synchronous)")
    write_json(args.json, "loop", rows, headline=head, settings={"legs": legs, "timed_steps_per_leg": timed,
                                                                 "order": list(ORDER), "rows": names})
    return 0


if __name__ == "__main__":
    preload()  # tcmalloc + Intel OpenMP, as in production runs (engine/preload.py)
    raise SystemExit(main())
