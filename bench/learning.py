"""Learning you can see: the main job's recipe (configs/default.toml) over several runs, with each RL
stage's gain on the held-out **test** split beside a supervised control of the same prompts, in
intervals that resample conversations (rl/task/eval/stats.py).

    python -m memr1.bench.learning [--quick] [--seeds 0,1] [--data-seeds 0,1] [--config configs/default.toml]
                                   --json PATH

A run is a (data seed, training seed) pair, the two lists paired element by element (`--seeds 0,1
--data-seeds 0,1`: runs d0s0 and d1s1), each one `memr1 train` run in its own process (data.seed=D,
seed=S, eval_split=test, both controls of each RL stage and their policies added: "<role>_control",
SFT on the oracle's labels for the RL stage's prompts, and "<role>_rs", rejection sampling on the RL
stage's own rollouts, which needs no label; plus the ADD-every-fact banks). The data seed draws a
whole new synthetic set, train, val and test conversations alike, so runs with different data seeds
differ in which conversations they learn from and are tested on; the training seed changes item order,
sampling and initialisation noise only. Rows, each with its `data_seed` and training `seed`, in points
(0 to 100), read from the run's eval/summary.json and metrics.jsonl, each with base, warm, trained,
control and rs columns (add_all: the ADD-every-fact banks, manager rows):
  stage "answer"      em, f1: the answer agent alone, on the synthetic oracle's banks;
                      em_warm_manager_banks, f1_warm_manager_banks: on the warm manager's banks, the ones
                      the outcome-only recipe's answer stage trains on
  stage "manager"     em_fixed_answerer, f1_fixed_answerer: the trained answer agent, fixed, on the
                      banks each policy's manager built (the manager measured on what its reward optimises);
                      op_accuracy (all calls), op_accuracy_seen / _unseen (calls whose ops the reward can /
                      cannot see), op_accuracy_ids (UPDATE and DELETE must hit the oracle's memory);
                      parse_failure (greedy bank building in eval); parse_failure_last3 (trained: the
                      last 3 RL steps, sampled at the rollout temperature)
  stage "end_to_end"  em, f1: each policy's full pipeline
  stage "locomo_val"  (when the LoCoMo file is present) f1, bleu1, memories_per_10_turns: base, warm and
                      trained agents on LoCoMo's val conversation, facts extracted by the base model (one
                      conversation, so its deltas carry no interval: rl/task/eval/stats.py)
Every comparison is paired: delta = trained - base, rl_delta = trained - warm (RL's own part),
vs_control = trained - control (RL against as much supervised training on the same prompts), vs_rs =
trained - rs (RL against rejection sampling on the same rollouts), vs_add_all = the trained manager's
banks against ADD-every-fact banks under the trained answer agent, each
with its 95% interval (`*_ci_low`, `*_ci_high`). `minutes` is the run's wall time; the JSON's `phases`
holds each run's minutes per stage and per eval, `compute` each arm's generated and learner tokens and
minutes (equal data and compute: rl/algos/rejection.py), and `op_visibility` the share of train items whose
reward changes with each op kind (rl/task/eval/op_probe.py, by the run's trained answer agent), both keyed by the
run's name (d<D>s<S>). The headline, per run, in points with their intervals: HEADLINE below, for the
rows the run made.
"""
import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

from memr1.bench.common import git_commit, headline_entry, print_table, write_json
from memr1.engine.compare import fixed_answerer, warm_banks

ROOT = Path(__file__).resolve().parents[1]
LOCOMO = ROOT.parent / "shared" / "data" / "locomo_train_val.json"
# What bench.learning adds to the recipe: the test split, and the controls beside each RL stage.
EXTRA = ["data.n=300", "eval_split=test", 'eval_after=["base", "warm", "trained", "control", "rs", "add_all"]']
POLICIES = ("base", "warm", "trained", "control", "rs", "add_all")
# (column prefix, column): each comparison a row may carry, its delta and 95% interval
COMPARISONS = (("", "delta"), ("rl_", "rl_delta"), ("vs_control_", "vs_control"), ("vs_rs_", "vs_rs"),
               ("vs_add_all_", "vs_add_all"))
COLUMNS = ["stage", "data_seed", "seed", "metric", *POLICIES,
           *(c for prefix, key in COMPARISONS for c in (key, f"{prefix}ci_low", f"{prefix}ci_high")),
           "split", "cluster", "n", "minutes"]


def with_controls(stages: list[str]) -> list[str]:
    """The recipe's stages with its two controls right after each RL stage whose warm start ran:
    "<role>_control" (SFT on the oracle's labels for the same prompts: what labels buy) and "<role>_rs"
    (rejection sampling on the RL stage's own rollouts: no labels, equal data and compute)."""
    from memr1.engine.config.stages import stage_name

    out = []
    for name in stages:
        out.append(name)
        n = stage_name(name)
        if n.kind == "rl" and n.of("warm") in stages:
            out += [n.of("control"), n.of("rs")]
    return out


def runs(seeds: str, data_seeds: str, quick: bool = False) -> list[tuple[int, int]]:
    """The (data seed, training seed) pairs of --data-seeds and --seeds, element by element; --quick: the first."""
    parse = lambda text: [int(x) for x in text.split(",") if x.strip()]
    try:
        train, data = parse(seeds), parse(data_seeds)
    except ValueError:
        raise SystemExit(f"--seeds {seeds!r} / --data-seeds {data_seeds!r}: need comma-separated integers") from None
    if len(train) != len(data) or not train:
        raise SystemExit(f"--seeds and --data-seeds pair up element by element, so they need the same (non-zero) "
                         f"length: got {len(train)} seeds ({seeds}) and {len(data)} data seeds ({data_seeds})")
    pairs = list(zip(data, train))
    if len(set(pairs)) != len(pairs):
        raise SystemExit(f"--data-seeds {data_seeds} with --seeds {seeds}: a (data seed, seed) pair repeats")
    return pairs[: 1 if quick else None]


def run_name(data_seed: int, seed: int) -> str:
    return f"d{data_seed}s{seed}"


def train_command(config: str, run: Path, data_seed: int, seed: int, stages: list[str], overrides: list[str]) -> list:
    """The child `memr1 train` of one run (the caller's overrides last, so they win)."""
    return [sys.executable, "-m", "memr1.engine.cli", "train", "--config", config, f"data.seed={data_seed}",
            f"seed={seed}", f"run_dir={run}", *EXTRA, f"stages={json.dumps(stages)}", *overrides]


def row(stage: str, metric: str, cols: dict, comp: dict, comparisons: dict, seed: int, minutes: float,
        split: str = "test") -> dict:
    """One bench row: a column per policy, and each comparison's delta and interval (from the summary)."""
    r = {"stage": stage, "seed": seed, "metric": metric, **{k: cols.get(k) for k in POLICIES},
         "split": split, "cluster": "conversation", "minutes": minutes}
    for prefix, key in COMPARISONS:
        c = (comparisons.get(comp.get(key, "")) or {}).get(comp.get("metric", metric)) or {}
        r[key] = c.get("delta")
        r[f"{prefix}ci_low"], r[f"{prefix}ci_high"] = c.get("ci_low"), c.get("ci_high")
        r.setdefault("n", c.get("n"))
    return r


def with_data_seed(rows: list[dict], data_seed: int) -> list[dict]:
    """Each row with its run's data seed, next to its training seed."""
    return [{"stage": r["stage"], "data_seed": data_seed, **r} for r in rows]


def rows_of(run: Path, seed: int, minutes: float, data_seed: int = 0) -> list[dict]:
    s = json.loads((run / "eval" / "summary.json").read_text())
    rows, comp = s["rows"], s["comparisons"]
    get = lambda label, metric: (rows.get(label) or {}).get(metric)
    policies = ("base", "warm", "trained", "control", "rs")
    pairs = lambda suffix="": {"delta": f"trained{suffix} - base{suffix}", "rl_delta": f"trained{suffix} - warm{suffix}",
                               "vs_control": f"trained{suffix} - control{suffix}", "vs_rs": f"trained{suffix} - rs{suffix}"}
    against = (("delta", "base"), ("rl_delta", "warm"), ("vs_control", "control"), ("vs_rs", "rs"))
    out = []
    for m in ("em", "f1"):
        out.append(row("answer", m, {p: get(f"{p}.oracle_banks", m) for p in policies}, pairs(".oracle_banks"), comp,
                       seed, minutes))
    for m in ("em", "f1"):   # each answer agent on the warm manager's banks (the outcome recipe trains it there)
        out.append(row("answer", f"{m}_warm_manager_banks", {p: get(warm_banks(p), m) for p in policies[1:]},
                       {"metric": m, **{k: f"{warm_banks('trained')} - {warm_banks(p)}" for k, p in against[1:]}},
                       comp, seed, minutes))
    fixed = {p: fixed_answerer(p) for p in (*policies, "add_all")}
    for m in ("em", "f1"):
        out.append(row("manager", f"{m}_fixed_answerer", {p: get(fixed[p], m) for p in fixed},
                       {"metric": m, **{k: f"trained - {fixed[p]}" for k, p in (*against, ("vs_add_all", "add_all"))}},
                       comp, seed, minutes))
    for m in ("op_accuracy", "op_accuracy_seen", "op_accuracy_unseen", "op_accuracy_ids", "parse_failure"):
        out.append(row("manager", m, {p: get(p, m) for p in policies}, pairs(), comp, seed, minutes))
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last3 = [r["parse_failure_rate"] for r in steps if r.get("stage") == "manager" and "parse_failure_rate" in r][-3:]
    out.append(row("manager", "parse_failure_last3", {"trained": 100 * sum(last3) / len(last3) if last3 else None},
                   {}, comp, seed, minutes, split="train"))
    for m in ("em", "f1"):
        out.append(row("end_to_end", m, {p: get(p, m) for p in policies}, pairs(), comp, seed, minutes))
    return with_data_seed(out, data_seed)


def compute_of(run: Path) -> dict:
    """Per stage (each arm: RL, its controls), what it cost: tokens the policy generated, tokens the
    frozen answerer generated for its rewards, token positions the learner computed, and the minutes of
    its steps (probes left out), summed over the steps in metrics.jsonl."""
    out: dict[str, dict] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("phase_start") or r.get("skipped"):
            continue
        c = out.setdefault(r["stage"], {"steps": 0, "generated_tokens": 0, "frozen_tokens": 0,
                                        "learner_positions": 0, "minutes": 0.0})
        c["steps"] += 1
        c["generated_tokens"] += int(r.get("response_tokens", 0)) if r.get("gen_s") else 0
        c["frozen_tokens"] += int(r.get("frozen_tokens", 0))
        c["learner_positions"] += int(r.get("positions", 0))
        c["minutes"] += (r.get("step_s", 0.0) - r.get("probe_s", 0.0)) / 60
    return {k: {**v, "minutes": round(v["minutes"], 2)} for k, v in out.items()}


def locomo_rows(run: Path, seed: int, locomo: Path, minutes: float, data_seed: int = 0) -> tuple[list[dict], dict]:
    """Base, warm and trained agents on LoCoMo's val conversation (facts extracted by the base model,
    extraction cut at 96 tokens), evaluated through `memr1 eval`; rows and each policy's op mix."""
    from memr1.rl.task.eval.stats import compare_reports

    cfg = run / "config.toml"
    models = {"base": [], "warm": ["--manager", str(_final(run, "manager_warm")), "--answer", str(_final(run, "answer_warm"))],
              "trained": ["--checkpoint", str(run)]}
    reports, extras = {}, {}
    for label, args in models.items():
        out = run / "locomo" / label
        cmd = [sys.executable, "-m", "memr1.engine.cli", "eval", "--config", str(cfg), "--split", "val", *args,
               f"data.path={locomo}", "extract.source=model", "extract.max_new_tokens=96", f"run_dir={out}",
               f"eval.baseline={'base' if label == 'base' else 'memr1'}", "eval.progress=false"]
        if not (out / "eval" / "val.json").is_file():
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            (run / "locomo").mkdir(exist_ok=True)
            (run / "locomo" / f"{label}.log").write_text(proc.stdout + proc.stderr)
            if proc.returncode != 0:
                raise SystemExit(f"{run.name}: locomo eval of {label} exited {proc.returncode} (log in {run}/locomo)")
        reports[label] = json.loads((out / "eval" / "val.json").read_text())
        mgr = reports[label].get("manager") or {}
        turns = reports[label]["input"]["turns"]
        memories = sum((mgr.get("final_memories") or {}).values())
        extras[label] = {"events": mgr.get("events"), "memories": memories, "turns": turns,
                         "memories_per_10_turns": 10 * memories / turns if turns else None}
    comp = {f"trained - {a}": compare_reports(reports[a], reports["trained"]) for a in ("base", "warm")}
    keys = {"delta": "trained - base", "rl_delta": "trained - warm"}
    out = [row("locomo_val", m, {p: reports[p]["metrics"]["overall"][m] for p in models}, keys, comp, seed, minutes,
               split="val") for m in ("f1", "bleu1")]
    out.append(row("locomo_val", "memories_per_10_turns", {p: extras[p]["memories_per_10_turns"] for p in models},
                   {}, comp, seed, minutes, split="val"))
    return with_data_seed(out, data_seed), extras


def _final(run: Path, stage: str) -> Path:
    from memr1.engine.checkpoints.io import final_checkpoint
    found = final_checkpoint(run / stage)
    if found is None:
        raise SystemExit(f"{run}: stage {stage} has no checkpoint")
    return found


def visibility(run: Path, items: int) -> dict:
    """rl/task/eval/op_probe.py on the run's train items, by its trained answer agent (bench/op_probe.py)."""
    out = run / "op_visibility.json"
    if not out.is_file():
        cmd = [sys.executable, "-m", "memr1.bench.op_probe", "--run", str(run), "--items", str(items), "--json", str(out)]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stdout[-2000:] + proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{run.name}: the op probe exited {proc.returncode}")
    return json.loads(out.read_text())["rows"]


# (stage, metric, column, ci prefix, ours, baseline, target, what) of each headline entry, in points.
HEADLINE = (
    ("manager", "em_fixed_answerer", "rl_delta", "rl_", "trained manager", "warm manager", 10.0,
     "EM of the trained answer agent on the banks each manager built, trained minus warm: RL's own part"),
    ("manager", "em_fixed_answerer", "vs_rs", "vs_rs_", "trained manager", "rejection-sampling manager", None,
     "EM of the trained answer agent on the banks each manager built, RL minus rejection sampling on its rollouts"),
    ("manager", "em_fixed_answerer", "vs_add_all", "vs_add_all_", "trained manager", "ADD-every-fact banks", None,
     "EM of the trained answer agent on the trained manager's banks minus on banks that ADD every fact"),
    ("answer", "em_warm_manager_banks", "rl_delta", "rl_", "trained answer agent", "warm answer agent", 10.0,
     "EM on the warm manager's banks (those the answer stage trained on), trained minus warm: RL's own part"),
    ("answer", "em_warm_manager_banks", "vs_rs", "vs_rs_", "trained answer agent", "rejection-sampling answer agent",
     None, "EM on the warm manager's banks, RL minus rejection sampling on its rollouts"),
    ("answer", "em", "delta", "", "trained answer agent", "base answer agent", 15.0,
     "EM on the oracle's banks, trained minus base"),
    ("answer", "em", "vs_control", "vs_control_", "trained answer agent", "control answer agent", None,
     "EM on the oracle's banks, trained minus the supervised control on the same prompts"),
    ("locomo_val", "f1", "delta", "", "trained pipeline", "base pipeline", 5.0, "F1 on LoCoMo val, trained minus base"),
)


def headline(rows: list[dict], stages: list[str] | None = None) -> list[dict]:
    """The entries of HEADLINE and the trained pipeline's memories per 10 turns on LoCoMo, per run, for
    the rows that exist (a value None where the run's summary had none; an interval None where it had
    none, as over LoCoMo's one val conversation). With the runs' `stages`, a role without an RL stage
    (configs/budget.toml trains no answer RL) has no entries: its "RL part" would be empty."""
    out = []
    for r in rows:
        who = f"data seed {r.get('data_seed')}, seed {r['seed']}"
        for stage, metric, col, ci, ours, base, target, what in HEADLINE:
            if stages is not None and stage in ("answer", "manager") and stage not in stages:
                continue
            if (r["stage"], r["metric"]) == (stage, metric):
                out.append(headline_entry(f"{who}: {stage} {metric}, {ours} - {base}", r.get(col), ours,
                                          base, what, unit="points", target=target, ci_low=r.get(f"{ci}ci_low"),
                                          ci_high=r.get(f"{ci}ci_high")))
        if (r["stage"], r["metric"]) == ("locomo_val", "memories_per_10_turns"):
            out.append(headline_entry(f"{who}: locomo_val memories_per_10_turns, trained", r.get("trained"),
                                      "trained pipeline", "none", "memories the trained manager keeps per 10 turns of "
                                      "LoCoMo val (base and warm beside)", unit="count", target=1.0,
                                      base=r.get("base"), warm=r.get("warm")))
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
    p.add_argument("--quick", action="store_true", help="the first run (data seed, seed) only")
    p.add_argument("--seeds", default="0,1", help="training seeds (seed=S), one per run")
    p.add_argument("--data-seeds", default="0,1",
                   help="synthetic data set seeds (data.seed=D), one per run, paired with --seeds element by element")
    p.add_argument("--config", default=str(ROOT / "configs" / "default.toml"))
    p.add_argument("--runs", default="runs/bench_learning", help="where each run's directory (d<D>s<S>) goes")
    p.add_argument("--json", required=True)
    p.add_argument("--locomo", default=str(LOCOMO), help="LoCoMo file for the locomo_val rows ('' to skip)")
    p.add_argument("--probe-items", type=int, default=400, help="train items for the op-visibility probe (0: skip)")
    p.add_argument("--reuse", action="store_true",
                   help="a run already finished under --runs by the same command, config text and commit "
                        "is read, not rerun")
    p.add_argument("overrides", nargs="*", help="key=value config overrides for every run")
    args = p.parse_args(argv)
    pairs = runs(args.seeds, args.data_seeds, args.quick)
    folder = Path(args.runs).resolve()   # the child runs from the repository root
    from memr1.engine.config.run import load_config
    stages = with_controls(load_config(args.config, args.overrides).stages)
    rows, timing, extras = [], {}, {}
    for data_seed, seed in pairs:
        name = run_name(data_seed, seed)
        run = folder / name
        cmd = train_command(args.config, run, data_seed, seed, stages, args.overrides)
        done = folder / f"{name}.json"   # what a finished run leaves: what ran, minutes and phases
        what = {"cmd": cmd[1:], "config_sha256": hashlib.sha256(Path(args.config).read_bytes()).hexdigest(),
                "commit": git_commit()}
        if args.reuse and done.is_file() and json.loads(done.read_text())["what"] == what:
            print(f"{name}: reusing the finished run in {run}", flush=True)
        else:
            print(" ".join(cmd), flush=True)
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            minutes = (time.perf_counter() - t0) / 60
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{name}.log").write_text(proc.stdout + proc.stderr)
            if proc.returncode != 0:
                print(proc.stdout[-3000:] + proc.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"{name}: memr1 train exited {proc.returncode} (log in {folder}/{name}.log)")
            done.write_text(json.dumps({"what": what, "minutes": round(minutes, 2), "phases": phases(proc.stdout)}))
        finished = json.loads(done.read_text())
        rows += rows_of(run, seed, finished["minutes"], data_seed)
        timing[name] = finished["phases"]
        extras[name] = {"compute": compute_of(run)}
        if args.probe_items:
            extras[name]["op_visibility"] = visibility(run, args.probe_items)
        if args.locomo and Path(args.locomo).is_file():
            t0 = time.perf_counter()
            got, extras[name]["locomo_val"] = locomo_rows(run, seed, Path(args.locomo), finished["minutes"], data_seed)
            rows += got
            timing[name]["locomo_val"] = round((time.perf_counter() - t0) / 60, 2)
    print_table(rows, [c for c in COLUMNS if c not in ("split", "cluster", "n")])
    write_json(args.json, "learning", rows, headline=headline(rows, stages),
               settings={"config": args.config, "data_seeds": [d for d, _ in pairs], "seeds": [s for _, s in pairs],
                         "stages": stages, "extra": EXTRA, "overrides": args.overrides, "locomo": args.locomo,
                         "probe_items": args.probe_items},
               phases=timing, extras=extras)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
