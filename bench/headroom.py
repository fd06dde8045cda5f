"""The manager's headroom: how much better an answer agent does on the oracle's banks than on banks
that ADD every fact, under the same reader, beside the banks the learned managers built. If memory
operations cannot beat ADD-every-fact by much even when they are perfect, RL on them has little to find.

    python -m memr1.bench.headroom RUN_DIR [RUN_DIR ...] --json PATH

Each RUN_DIR is a finished `memr1 train` run with `"add_all"` in eval_after and both roles trained, such
as the runs `bench.learning` leaves (`d<D>s<S>`), or a run with no manager RL stage, whose "trained"
pipeline is then its warm manager's (a task's pre-registration, configs/budget.toml). The reader is the
run's last answer agent (the `reader` column names its stage and banks); per run,
one row per metric with a column per bank source:
  oracle      the synthetic oracle's banks (perfect operations)
  add_all     every fact ADDed, nothing updated or deleted
  warm        the format-start (or warm-start) manager's banks
  control     the manager's SFT control (oracle labels on the RL stage's prompts), when the run has one
  rs          the manager's rejection-sampling control, when the run has one
  trained     the RL-trained manager's banks
and `headroom` = oracle - add_all, paired over questions, with its 95% interval resampling
conversations (rl/task/eval/stats.py). RULE is the decision this table settles, fixed before the runs it reads:
the headline says, per run, whether the rule's "no headroom" condition holds.
"""
import argparse
import json
import tomllib
from pathlib import Path

from memr1.bench.common import headline_entry, print_table, write_json
from memr1.rl.task.eval.stats import compare_reports

RULE = ("If, under the better reader, the oracle's banks beat ADD-every-fact banks by less than 2 EM points "
        "with a 95% interval (conversations resampled) that includes 0, at both data seeds, then on this task "
        "memory operations have no headroom for RL, and the call-level manager target is retired.")
THRESHOLD = 2.0
# column -> the eval report (eval/<split>.<label>.json) of the run's trained answer agent on those banks
SOURCES = {"oracle": "trained.oracle_banks", "add_all": "trained_answer.add_all_manager",
           "warm": "trained_answer.warm_manager", "control": "trained_answer.control_manager",
           "rs": "trained_answer.rs_manager", "trained": "trained"}
COLUMNS = ["run", "data_seed", "reader", "metric", *SOURCES, "headroom", "ci_low", "ci_high", "n", "no_headroom"]


def run_config(run: Path) -> dict:
    """The run's config as run (config.toml, overrides applied)."""
    path = run / "config.toml"
    if not path.is_file():
        raise SystemExit(f"{run}: no config.toml: not a memr1 train run")
    return tomllib.loads(path.read_text())


def reports(run: Path, split: str) -> dict[str, dict]:
    """source -> eval report of a finished run; SystemExit naming what is missing."""
    out = {}
    for col, label in SOURCES.items():
        path = run / "eval" / f"{split}.{label}.json"
        if path.is_file():
            out[col] = json.loads(path.read_text())
    for need in ("oracle", "add_all"):
        if need not in out:
            raise SystemExit(f"{run}: no eval/{split}.{SOURCES[need]}.json: the run needs \"add_all\" in eval_after, "
                             f"synthetic data and both roles trained")
    return out


def task_of(run: Path) -> str:
    """The run's built-in data kind (data.kind): one headroom table per task (bench.table labels it)."""
    return run_config(run).get("data", {}).get("kind", "synthetic")


def reader_of(cfg: dict) -> str:
    """Which answer agent reads every column: the run's last answer stage that hands on its weights."""
    stages = [s for s in cfg.get("stages", ["answer"]) if s.startswith("answer") and not s.endswith(("_control", "_rs"))]
    last = stages[-1] if stages else "base model"
    banks = cfg.get("stage", {}).get(last, {}).get("banks") if last == "answer_warm" else cfg.get("items", {}).get(
        "answer_banks")
    return f"{last} ({banks} banks)" if banks else last


def rows_of(run: Path, resamples: int = 2000, seed: int = 0) -> list[dict]:
    cfg = run_config(run)
    split, data_seed = cfg.get("eval_split", "test"), cfg.get("data", {}).get("seed")
    rep = reports(run, split)
    if "manager" not in cfg.get("stages", ["manager"]) and "trained" in rep:
        # no manager RL (a task's pre-registration run): the run's last manager is its warm start
        rep.setdefault("warm", rep.pop("trained"))
    comp = compare_reports(rep["add_all"], rep["oracle"], resamples, seed)
    out = []
    for metric in ("em", "f1"):
        c = comp[metric]
        no = c["delta"] < THRESHOLD and c["ci_low"] is not None and c["ci_low"] <= 0 <= c["ci_high"]
        out.append({"run": run.name, "data_seed": data_seed, "reader": reader_of(cfg), "metric": metric,
                    **{col: rep[col]["metrics"]["overall"][metric] if col in rep else None for col in SOURCES},
                    "headroom": c["delta"], "ci_low": c["ci_low"], "ci_high": c["ci_high"], "n": c["n"],
                    "split": split, "no_headroom": bool(no)})
    return out


def headline(rows: list[dict]) -> list[dict]:
    em = [r for r in rows if r["metric"] == "em"]
    out = [headline_entry(f"{r['run']}: oracle banks - ADD-every-fact banks (EM, {r['reader']})", r["headroom"],
                          "oracle banks", "ADD-every-fact banks", "EM points the oracle's operations add over "
                          "ADDing every fact, under the run's reader", unit="points",
                          ci_low=r["ci_low"], ci_high=r["ci_high"], data_seed=r["data_seed"]) for r in em]
    seeds = {r["data_seed"] for r in em}
    holds = len(seeds) >= 2 and all(r["no_headroom"] for r in em)
    out.append(headline_entry("the headroom rule's no-headroom condition, at every data seed", float(holds),
                              "rule holds (1)", "rule fails (0)", RULE, unit="share", data_seeds=sorted(seeds)))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="finished memr1 train run folders")
    p.add_argument("--json", required=True)
    p.add_argument("--resamples", type=int, default=2000)
    args = p.parse_args(argv)
    tasks = {task_of(Path(run)) for run in args.runs}
    if len(tasks) != 1:
        raise SystemExit(f"the runs read different data kinds ({', '.join(sorted(tasks))}): one table is one task")
    rows = [r for run in args.runs for r in rows_of(Path(run), args.resamples)]
    print_table(rows, COLUMNS)
    write_json(args.json, "headroom", rows, headline=headline(rows), rule=RULE, task=tasks.pop())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
