"""`memr1 rollout` as a job: rollouts/s and where its wall time goes, at two group sizes.

    python -m memr1.bench.rollouts [--quick] [--checkpoint DIR] [--groups 8,64] [--items 8] [--repeats 3]
                                   --json PATH

Each run is the real command (`memr1 rollout --stage manager --split train`) in a fresh process, into a
fresh folder; runs alternate between the group sizes (8, 64, 64, 8, ...), and each row carries the medians
over its runs. What a run is timed on is its steps and shard writes (summary.json's throughput); its
set-up (engines, items, banks) is a column of its own. Phases, as shares of that wall time:
  generate      the policy's sampling (vLLM on CPU here)
  frozen        the frozen answer agent answering every fork's questions (generation too)
  bank          the manager prompts' retrieval and each completion's fork and op application
  reward        parsing the ops and the answers, and the rewards
  write         building and writing the Parquet shards
`outside_generation` is 1 - (generate + frozen) / wall. A base model whose replies mostly fail to parse
applies few ops and understates the bank's share: pass the trained checkpoint of `make train`
(runs/default, the default when it exists) and read `parse_failure` beside the shares.
--quick: a tiny random model (built once under the cache; --model to pass one) on the HF backend, groups 2
and 4, one run each (a smoke test of the bench, not a measurement).
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from memr1.bench.common import headline_entry, print_table, write_json

ROOT = Path(__file__).resolve().parents[1]
SHARES = ("generate", "frozen", "bank", "reward", "write", "other")


def run_once(out: Path, group: int, items: int, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "memr1.engine.cli", "rollout", "--config", str(ROOT / "configs" / "default.toml"),
           "--stage", "manager", "--split", "train", "--items", str(items), "--group-size", str(group),
           "--out", str(out), *extra]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"memr1 rollout failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads((out / "summary.json").read_text())


def shares(summary: dict) -> dict:
    """One run's phase shares of its timed wall (steps + writes) and its rates."""
    t, sec = summary["throughput"], summary["phases"]["seconds"]
    wall = t["wall_s"]
    parts = {"generate": sec["generate"], "frozen": sec["frozen"], "bank": sec["prompt"] + sec["fork_apply"],
             "reward": sec["reward"], "write": t["write_s"]}
    parts["other"] = max(0.0, wall - sum(parts.values()))
    out = {f"{k}_share": v / wall for k, v in parts.items()}
    out.update({"rollouts_per_s": t["rollouts_per_s"], "generated_tokens_per_s": t["generated_tokens_per_s"],
                "outside_generation": 1 - (parts["generate"] + parts["frozen"]) / wall,
                "bank_reward_share": (parts["bank"] + parts["reward"]) / wall, "wall_s": wall, "setup_s": t["setup_s"],
                "completions": summary["counts"]["rows"],
                "parse_failure": summary["reward"]["by_op"]["parse_error"]["n"] / summary["counts"]["rows"]})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny model, groups 2 and 4, one run each")
    p.add_argument("--checkpoint", default=None, help="a `memr1 train` run dir or HF checkpoint (default: runs/default "
                   "when it exists, else the base model)")
    p.add_argument("--groups", default=None, help="group sizes (default 8,64; --quick: 2,4)")
    p.add_argument("--items", type=int, default=None, help="items per run (default 8; --quick: 2)")
    p.add_argument("--repeats", type=int, default=None, help="runs per group size (default 3; --quick: 1)")
    p.add_argument("--model", default=None, help="with --quick: a tiny model folder (default: a tiny random Llama "
                   "built once under the cache)")
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    groups = [int(g) for g in (args.groups or ("2,4" if args.quick else "8,64")).split(",")]
    items, repeats = args.items or (2 if args.quick else 8), args.repeats or (1 if args.quick else 3)
    extra = ["stage.manager.prompts_per_step=2"] if args.quick else []
    checkpoint = args.checkpoint or (str(ROOT / "runs" / "default") if (ROOT / "runs" / "default").is_dir() else None)
    if args.quick:
        if not args.model:  # the tests' tiny random Llama, built once under the cache
            from memr1.bench.common import tiny_llama
            from memr1.engine.generation.model import cache_root
            model = cache_root() / "models" / "bench-rollouts-tiny"
            if not model.is_dir():  # built aside and renamed, so an interrupted build is never used
                model.parent.mkdir(parents=True, exist_ok=True)
                tmp = Path(tempfile.mkdtemp(dir=model.parent))
                tiny_llama(tmp)
                tmp.rename(model)
            args.model = str(model)
        extra += [f"generator.model={args.model}", "generator.backend=hf", "generator.max_model_len=2048",
                  "embedder=hash", "data.n=3", "extract.source=oracle", "items.bank_pipeline=oracle",
                  "manager.max_new_tokens=8", "answer.max_new_tokens=4", "answer.distill=false"]
        checkpoint = None
    if checkpoint:
        extra = ["--checkpoint", checkpoint, *extra]
    order = [g for r in range(repeats) for g in (groups if r % 2 == 0 else groups[::-1])]
    runs: dict[int, list[dict]] = {g: [] for g in groups}
    with tempfile.TemporaryDirectory() as tmp:
        for n, g in enumerate(order):
            got = shares(run_once(Path(tmp) / f"run{n}", g, items, extra))
            runs[g].append(got)
            print(f"G={g} run {len(runs[g])}: {got['rollouts_per_s']:.2f} rollouts/s, outside generation "
                  f"{got['outside_generation']:.3f}, bank+reward {got['bank_reward_share']:.3f}", flush=True)
    rows = []
    for g in groups:
        med = {k: statistics.median(r[k] for r in runs[g]) for k in runs[g][0]}
        rows.append({"group_size": g, "items": items, "runs": len(runs[g]), **med,
                     "rollouts_per_s_runs": [r["rollouts_per_s"] for r in runs[g]]})
    print_table(rows, ["group_size", "completions", "rollouts_per_s", "generated_tokens_per_s", "outside_generation",
                       *(f"{s}_share" for s in SHARES), "bank_reward_share", "parse_failure", "setup_s"])
    top = max(rows, key=lambda r: r["group_size"])
    write_json(args.json, "rollouts", rows, settings={"groups": groups, "items": items, "repeats": repeats,
                                                      "order": order, "checkpoint": checkpoint, "quick": args.quick},
               headline=[headline_entry(
                   f"G={top['group_size']}: bank and reward share of wall time", top["bank_reward_share"],
                   f"G={top['group_size']}", "none", "the share of a rollout job's wall time spent in the bank "
                   "(retrieval, forks, ops) and in rewards, at the largest group", unit="share", better="lower",
                   target=0.10, outside_generation=top["outside_generation"])])
    return 0


if __name__ == "__main__":
    from memr1.engine.preload import preload

    preload()
    raise SystemExit(main())
