"""Can the manager's reward see each kind of op? rl/op_probe.py on a finished run's train items.

    python -m memr1.bench.op_probe --run RUN_DIR [--items N] --json PATH

The run's manager stage, built as training builds it (its items, guards, frozen answer agent = the
run's final answer-agent checkpoint), scores the oracle's reply and each one-mistake reply on N train
items (the first N of the stage's shuffled walk). Rows: per variant (ADD:skip, ADD:overwrite,
UPDATE:as_add, UPDATE:wrong_id, DELETE:skip, NONE:add, NONE:update), the items that hold that op kind,
the share whose reward differs, and the mean outcome score with the oracle's reply and with the mistake.
The headline is that share per variant: how much of each mistake the reward can see.
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
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)

    from memr1.engine.checkpoints.io import final_checkpoints
    from memr1.engine.config.resolve import resolve
    from memr1.engine.config.run import load_config, make_embedder
    from memr1.engine.generation import make_generator
    from memr1.engine.generation.swap import WeightSwap
    from memr1.engine.items import RunItems
    from memr1.engine.train import make_stage
    from memr1.rl.op_probe import VARIANTS, op_visibility

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
        stage = make_stage(run, "manager", items, embedder, swap.generator.tokenizer, swap, {"answer": answer})
        probe = stage.items[: args.items]
        found = op_visibility(stage, probe, {c.sample_id: c.oracle for c in items.convs})
    finally:
        items.close()
    rows = [{"variant": v, **found[v]} for v in VARIANTS]
    print_table(rows, ["variant", "items", "differ", "share", "em_oracle", "em_wrong"])
    write_json(args.json, "op_probe", rows, headline=headline(rows),
               settings={"run": str(run_dir), "items": len(probe), "answer": str(answer), "reward": cfg.reward.kind})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
