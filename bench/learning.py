"""Learning you can see: the main job's recipe (configs/default.toml) at several seeds, and what each
stage gained on the held-out val split, with paired bootstrap intervals.

    python -m memr1.bench.learning [--quick] [--seeds 0,1] [--config configs/default.toml] --json PATH

Each seed is one `memr1 train` run in its own process (seed=S; the synthetic data set is the same for
every seed, so the seeds differ in item order, sampling and initialisation noise only). Rows, in
points (0 to 100), read from the run's eval/summary.json and metrics.jsonl:
  stage "answer"      em, f1: the answer agent alone, on the synthetic oracle's banks
                      (base, warm start, trained; delta and interval of trained - base; rl_* of
                      trained - warm: RL's own part)
  stage "manager"     op_accuracy: the manager's ops against the oracle, per call (trained - base);
                      parse_failure_last3: the share of unparseable manager completions over the last
                      3 RL steps (trained) and in eval bank building (base, warm);
                      f1: the trained answer agent on banks of the trained manager (trained) against
                      banks of the base manager (base): the paper's "without the RL manager" ablation
  stage "end_to_end"  em, f1: the full pipeline, trained manager and answer agent against the base model
`minutes` is the run's wall time; the JSON's `phases` holds each seed's minutes per stage and per eval.
"""
import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

from memr1.bench.common import git_commit, print_table, write_json

ROOT = Path(__file__).resolve().parents[1]


def rows_of(run: Path, seed: int, minutes: float) -> list[dict]:
    s = json.loads((run / "eval" / "summary.json").read_text())
    rows, comp = s["rows"], s["comparisons"]
    get = lambda label, metric: (rows.get(label) or {}).get(metric)

    def row(stage, metric, base, warm, trained, comparison=None, rl=None):
        c = (comp.get(comparison) or {}).get(metric, {}) if comparison else {}
        r = {"stage": stage, "seed": seed, "metric": metric, "base": base, "warm": warm, "trained": trained,
             "delta": c.get("delta", None if trained is None or base is None else trained - base),
             "ci_low": c.get("ci_low"), "ci_high": c.get("ci_high"), "n": c.get("n"), "minutes": minutes}
        if rl:
            d = (comp.get(rl) or {}).get(metric, {})
            r.update(rl_delta=d.get("delta"), rl_ci_low=d.get("ci_low"), rl_ci_high=d.get("ci_high"))
        return r

    out = []
    for m in ("em", "f1"):
        out.append(row("answer", m, get("base.oracle_banks", m), get("warm.oracle_banks", m), get("trained.oracle_banks", m),
                       "trained.oracle_banks - base.oracle_banks", "trained.oracle_banks - warm.oracle_banks"))
    out.append(row("manager", "op_accuracy", get("base", "op_accuracy"), get("warm", "op_accuracy"),
                   get("trained", "op_accuracy"), "trained - base", "trained - warm"))
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last3 = [r["parse_failure_rate"] for r in steps if r.get("stage") == "manager" and "parse_failure_rate" in r][-3:]
    out.append(row("manager", "parse_failure_last3", get("base", "parse_failure"), get("warm", "parse_failure"),
                   100 * sum(last3) / len(last3) if last3 else None))
    out.append(row("manager", "f1", get("trained_answer.base_manager", "f1"), None, get("trained", "f1"),
                   "trained - trained_answer.base_manager"))
    for m in ("em", "f1"):
        out.append(row("end_to_end", m, get("base", m), get("warm", m), get("trained", m), "trained - base",
                       "trained - warm"))
    return out


def phases(log: str) -> dict:
    """Minutes per stage and per eval, from the run's own log lines."""
    out = {}
    for line in log.splitlines():
        if line.startswith("stage ") and "s, hands on" in line:
            name, secs = line.split()[1].rstrip(":"), line.split()[2].rstrip("s,")
            out[f"stage {name}"] = round(float(secs) / 60, 2)
        elif line.startswith("wall ") and line.endswith(" s"):
            out[f"eval {len([k for k in out if k.startswith('eval')]) + 1}"] = round(float(line.split()[1]) / 60, 2)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one seed")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--config", default=str(ROOT / "configs" / "default.toml"))
    p.add_argument("--runs", default="runs/bench_learning", help="where each seed's run directory goes")
    p.add_argument("--json", required=True)
    p.add_argument("--reuse", action="store_true",
                   help="a seed already finished under --runs by the same command, config text and commit "
                        "is read, not rerun")
    p.add_argument("overrides", nargs="*", help="key=value config overrides for every seed")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")][: 1 if args.quick else None]
    runs = Path(args.runs).resolve()   # the child runs from the repository root
    rows, timing = [], {}
    for seed in seeds:
        run = runs / f"seed{seed}"
        cmd = [sys.executable, "-m", "memr1.engine.cli", "train", "--config", args.config, f"seed={seed}",
               f"run_dir={run}", *args.overrides]
        done = runs / f"seed{seed}.json"   # what a finished seed leaves: what ran, minutes and phases
        what = {"cmd": cmd[1:], "config_sha256": hashlib.sha256(Path(args.config).read_bytes()).hexdigest(),
                "commit": git_commit()}
        if args.reuse and done.is_file() and json.loads(done.read_text())["what"] == what:
            print(f"seed {seed}: reusing the finished run in {run}", flush=True)
        else:
            print(" ".join(cmd), flush=True)
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            minutes = (time.perf_counter() - t0) / 60
            runs.mkdir(parents=True, exist_ok=True)
            (runs / f"seed{seed}.log").write_text(proc.stdout + proc.stderr)
            if proc.returncode != 0:
                print(proc.stdout[-3000:] + proc.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"seed {seed}: memr1 train exited {proc.returncode} (log in {runs}/seed{seed}.log)")
            done.write_text(json.dumps({"what": what, "minutes": round(minutes, 2), "phases": phases(proc.stdout)}))
        finished = json.loads(done.read_text())
        rows += rows_of(run, seed, finished["minutes"])
        timing[seed] = finished["phases"]
    print_table(rows, ["stage", "seed", "metric", "base", "warm", "trained", "delta", "ci_low", "ci_high",
                       "rl_delta", "rl_ci_low", "minutes"])
    write_json(args.json, "learning", rows, settings={"config": args.config, "seeds": seeds,
                                                      "overrides": args.overrides}, phases=timing)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
