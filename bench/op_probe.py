"""Can the manager's reward see each kind of op? rl/task/eval/op_probe.py on a finished run's train items.

    python -m memr1.bench.op_probe --run RUN_DIR [--items N] --json PATH
    python -m memr1.bench.op_probe --run RUN_DIR --decisions [--items N] --json PATH

The run's manager stage, built as training builds it (its items, guards, frozen answer agent = the
run's final answer-agent checkpoint), scores the oracle's reply and each one-mistake reply on N train
items (the first N of the stage's shuffled walk). Rows: per variant (ADD:skip, ADD:overwrite,
UPDATE:as_add, UPDATE:wrong_id, DELETE:skip, NONE:add, NONE:update), the items that hold that op kind,
the share whose reward differs, and the mean outcome score with the oracle's reply and with the mistake.
The headline is that share per variant: how much of each mistake the reward can see.

`--decisions` asks instead whether each of the run's manager checkpoints (manager_warm, manager,
manager_control) would make those decisions: teacher-forced on the oracle's reply for the same items,
the mean and median probability it puts on each op's event and, for ops on a shown memory, on its id
(rl/task/eval/op_probe.py:decision_probs). 60 items on two checkpoints take about 1.5 minutes on 2 cores, where
reading a recipe off its evaluation takes a training run.
"""
import argparse
from pathlib import Path

from memr1.bench.common import headline_entry, print_table, write_json


def headline(rows: list[dict]) -> list[dict]:
    """Per variant, the share of its items whose reward differs from the oracle reply's (None where no
    item holds that op kind)."""
    return [headline_entry(f"{r['variant']}: reward differs", r.get("share"), r["variant"], "oracle reply",
                           f"share of the {r.get('items')} items holding this op kind whose manager reward with the "
                           "one-mistake reply differs from the oracle reply's", unit="share",
                           items=r.get("items"), differ=r.get("differ")) for r in rows]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="a `memr1 train` run directory with an answer-agent checkpoint")
    p.add_argument("--items", type=int, default=400)
    p.add_argument("--decisions", action="store_true", help="the manager checkpoints' probabilities of the "
                   "oracle's decisions, instead of the reward's visibility")
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    if not (Path(args.run) / "config.toml").is_file():
        raise SystemExit(f"error: --run {args.run}: no config.toml there; is it a `memr1 train` run directory?")
    if args.decisions:
        return decisions(Path(args.run), args.items, args.json)

    from memr1.engine.checkpoints.io import final_checkpoints
    from memr1.engine.config.resolve import resolve
    from memr1.engine.config.run import load_config, make_embedder
    from memr1.engine.generation import make_generator
    from memr1.engine.generation.swap import WeightSwap
    from memr1.engine.items import RunItems
    from memr1.engine.assembly import RunContext, make_stage
    from memr1.rl.task.eval.op_probe import VARIANTS, op_visibility

    run_dir = Path(args.run)
    cfg = load_config(run_dir / "config.toml")
    run = resolve(cfg, 0, 1)
    answer = final_checkpoints(run_dir, cfg.stages).get("answer")
    if answer is None:
        raise SystemExit(f"error: {run_dir}: no answer-agent checkpoint to answer with")
    embedder = make_embedder(cfg)
    swap = WeightSwap(make_generator(cfg.generator, cfg.seed), loaded=run.base_model)
    items = RunItems(run, embedder, swap, "train")
    try:
        # one engine: the probe samples nothing from a policy, it scores ops through the frozen answer agent
        ctx = RunContext(run, embedder, policy=swap.generator, swap=swap, items=items)
        stage = make_stage(ctx, "manager", {"answer": answer})
        probe = stage.items[: args.items]
        found = op_visibility(stage, probe, {c.sample_id: c.oracle for c in items.convs})
    finally:
        items.close()
    rows = [{"variant": v, **found[v]} for v in VARIANTS]
    print_table(rows, ["variant", "items", "differ", "share", "em_oracle", "em_wrong"])
    write_json(args.json, "op_probe", rows, headline=headline(rows),
               settings={"run": str(run_dir), "items": len(probe), "answer": str(answer), "reward": cfg.reward.kind})
    return 0


def decisions(run_dir: Path, n_items: int, json_path: str) -> int:
    import statistics

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memr1.engine.checkpoints.io import final_checkpoint
    from memr1.engine.config.resolve import resolve
    from memr1.engine.config.run import load_config, make_embedder
    from memr1.engine.generation.swap import WeightSwap
    from memr1.engine.items import RunItems
    from memr1.rl.task.eval.op_probe import decision_probs
    from memr1.rl.task.turns import manager_turns
    from memr1.rl.task.stages.warm import manager_target

    cfg = load_config(run_dir / "config.toml")
    if cfg.items.bank_pipeline != "oracle" or cfg.extract.source != "oracle":
        raise SystemExit(f"error: {run_dir}: --decisions scores the synthetic oracle's replies on its facts and "
                         f"banks; the run has items.bank_pipeline = {cfg.items.bank_pipeline!r}, "
                         f"extract.source = {cfg.extract.source!r}")
    run = resolve(cfg, 0, 1)
    checkpoints = {name: c for name in ("manager_warm", "manager", "manager_control")
                   if (c := final_checkpoint(run_dir / name)) is not None}
    if not checkpoints:
        raise SystemExit(f"error: {run_dir}: no manager checkpoint to probe")
    embedder = make_embedder(cfg)
    items = RunItems(run, embedder, WeightSwap(None), "train")   # the oracle's facts and banks: nothing generates
    try:
        probe = items.manager("manager")[:n_items]
        turns = manager_turns([(it.bank, it.call) for it in probe], embedder, run.task.manager)
        replies = [manager_target(t, [it.bank.get(i).text for i in t.prompt.bank_ids], it.call,
                                  items.by_id[it.conversation].oracle, run.task.manager.list_unchanged)
                   for t, it in zip(turns, probe)]
    finally:
        items.close()
    rows = []
    for name, ckpt in checkpoints.items():
        tokenizer = AutoTokenizer.from_pretrained(ckpt)
        model = AutoModelForCausalLM.from_pretrained(ckpt).eval()
        found = decision_probs(model, tokenizer, [t.prompt.messages for t in turns], replies)
        rows += [{"checkpoint": name, "decision": d, "event": e, "n": len(ps), "p_mean": statistics.fmean(ps),
                  "p_median": statistics.median(ps)} for (d, e), ps in sorted(found.items())]
    print_table(rows, ["checkpoint", "decision", "event", "n", "p_mean", "p_median"])
    write_json(json_path, "op_probe_decisions", rows, headline=[
        headline_entry(f"{r['checkpoint']} {r['decision']} {r['event']}: p", r["p_mean"], r["checkpoint"], "oracle reply",
                       f"mean probability the checkpoint puts on the oracle's {r['decision']} token of its "
                       f"{r['event']} ops, teacher-forced", unit="share", n=r["n"]) for r in rows],
        settings={"run": str(run_dir), "items": len(probe), "checkpoints": {k: str(v) for k, v in checkpoints.items()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
