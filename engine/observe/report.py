"""`memr1 report RUN_DIR [--out DIR]`: what a run learned and where its time went, as report.md, PNG
figures and summary.json (default folder RUN_DIR/report). `memr1 train` and `memr1 eval` run it at
their end; a report that fails there prints a warning and never fails the run.

It reads whatever the run left: metrics.jsonl (every stage's steps), config.toml, eval/*.json and
profile/<stage>/step_*.json, so it works on a run that crashed or is still going, and its first
section lists what is missing. Per-category intervals here are percentile bootstraps of each report's
per-question scores (at most 1,000 resamples, to stay fast); the overall paired differences are the
eval's own (eval/summary.json) when present.
"""
import json
import sys
import time
from pathlib import Path

from memr1.engine.observe import figures, throughput
from memr1.engine.observe.run_files import read_comparisons, read_config, read_evals, read_metrics
from memr1.engine.observe.traces import profile_section
from memr1.rl.task.data.locomo import CATEGORY_NAMES
from memr1.rl.fileio import write_atomic
from memr1.rl.task.eval.stats import bootstrap_mean, paired_bootstrap

POLICIES = ("base", "warm", "trained")
CURVE_KEYS = ("reward_mean", "em_mean", "f1_mean", "parse_failure_rate", "capped_rate")
RESAMPLES = 1000


class ReportError(ValueError):
    """Nothing to report from (the folder is missing or holds no run output)."""


def by_stage(rows: list[dict], order: list[str]) -> dict[str, dict]:
    """stage -> {"rows": trained steps (a resumed step's last row wins), "skipped": failed steps,
    "starts": the validations (loop.validate_start) and probes (loop.probe_every) of a phase's starting
    weights}."""
    out: dict[str, dict] = {}
    for r in rows:
        s = out.setdefault(r["stage"], {"steps": {}, "skipped": 0, "starts": {}})
        if r.get("skipped"):
            s["skipped"] += 1
        elif r.get("phase_start"):   # a validation and a probe of the same start share one row
            s["starts"].setdefault(r["step"], {}).update(r)
        else:
            s["steps"][r["step"]] = r
    names = [n for n in order if n in out] + [n for n in out if n not in order]
    return {n: {"rows": [out[n]["steps"][k] for k in sorted(out[n]["steps"])], "skipped": out[n]["skipped"],
                "starts": [out[n]["starts"][k] for k in sorted(out[n]["starts"])]} for n in names}


def category_cells(report: dict, resamples: int) -> dict:
    """metric -> category -> (mean, low, high) in points over the report's answered questions."""
    answers = report["answers"]
    groups = {c: [a for a in answers if CATEGORY_NAMES.get(a["category"]) == c] for c in figures.CATEGORIES[:-1]}
    groups["overall"] = answers
    return {m: {c: _whisker(bootstrap_mean([100 * a[m] for a in rows], resamples)) for c, rows in groups.items()}
            for m in ("f1", "em")}


def _whisker(cell: tuple | None) -> tuple | None:
    """A (value, low, high) cell for the figures, whose whiskers subtract the bounds: a bound that is
    None (an interval over one conversation, rl/task/eval/stats.py) becomes NaN, which draws no whisker."""
    if cell is None:
        return None
    return tuple(float("nan") if x is None else x for x in cell)


def delta_cells(a: dict, b: dict, overall: dict | None, resamples: int) -> dict:
    """metric -> category -> (b - a, low, high), paired over the questions both answered."""
    theirs = {(r["sample_id"], r["question"]): r for r in b["answers"]}
    pairs = [(r, theirs[(r["sample_id"], r["question"])]) for r in a["answers"] if (r["sample_id"], r["question"]) in theirs]
    out = {}
    for m in ("f1", "em"):
        out[m] = {}
        for c in figures.CATEGORIES:
            ps = [p for p in pairs if c == "overall" or CATEGORY_NAMES.get(p[0]["category"]) == c]
            r = (overall or {}).get(m) if c == "overall" else None   # the eval's own interval
            if r is None:
                r = paired_bootstrap([100 * x[m] for x, _ in ps], [100 * y[m] for _, y in ps], resamples)
            out[m][c] = None if r.get("delta") is None else _whisker((r["delta"], r.get("ci_low"), r.get("ci_high")))
    return out


def eval_table(name: str, report: dict) -> list[str]:
    cell = lambda x: "-" if x is None else f"{x:.1f}"
    lines = [f"**{name}** ({report.get('baseline')}, {report.get('n_questions')} questions)", "",
             "| category | F1 | EM | BLEU-1 | J | n |", "|---|---:|---:|---:|---:|---:|"]
    for c, m in report["metrics"].items():
        lines.append(f"| {c} | {cell(m.get('f1'))} | {cell(m.get('em'))} | {cell(m.get('bleu1'))} | "
                     f"{cell(m.get('j'))} | {m.get('n')} |")
    return lines + [""]


def throughput_table(summaries: dict[str, dict]) -> list[str]:
    num = lambda x, f="{:.1f}": "-" if x is None else f.format(x)
    lines = ["| stage | steps | wall s | generate | score | train | sync | other | gen tok/s | frozen tok/s | "
             "train pos/s | rollouts/s | forks/s | bank ops/s | MFU |", "|---|" + "---:|" * 14]
    for name, s in summaries.items():
        sh, tps = s["phase_share"], s["tokens_per_s"]
        mfu = "n/a" if s["mfu"] is None else f"{100 * s['mfu']:.1f}%"
        lines.append(f"| {name} | {s['steps']} | {s['wall_s']:.1f} | " +
                     " | ".join(num(None if sh[k] is None else 100 * sh[k], "{:.0f}%")
                                for k in ("generate", "score", "train", "sync", "other")) +
                     f" | {num(tps['generate'])} | {num(tps['frozen_answers'])} | {num(tps['train'])} | "
                     f"{num(s['rollouts_per_s'], '{:.2f}')} | {num(s['forks_per_s'], '{:.2f}')} | "
                     f"{num(s['bank_ops_per_s'], '{:.2f}')} | {mfu} |")
    return lines


def write_report(run_dir: Path, out_dir: Path | None = None) -> Path:
    """Write report.md, summary.json and the figures; returns report.md's path. Each goes to a new file
    renamed into place (rl/fileio.write_atomic), so nothing planted in the folder is written through;
    the default folder, inside the run folder, must itself be a folder and not a link elsewhere."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir} is not a directory")
    out = Path(out_dir) if out_dir else run_dir / "report"
    if not out_dir and out.is_symlink():
        raise ReportError(f"{out} is a symbolic link; remove it or give --out")
    try:
        return _write_report(run_dir, out)
    except OSError as e:   # a file where a figure goes, a full disk
        raise ReportError(f"{out}: cannot write the report there ({e.strerror or e})") from None


def _write_report(run_dir: Path, out: Path) -> Path:
    t0 = time.perf_counter()
    missing: list[str] = []
    cfg = read_config(run_dir, missing)
    if not (run_dir / "config.toml").is_file() and (run_dir / "metrics.jsonl").is_file():
        missing.append("config.toml: none, so the configured steps are unknown")
    evals = read_evals(run_dir, missing)
    traces = sorted((run_dir / "profile").glob("*/step_*.json"))
    if not (run_dir / "metrics.jsonl").is_file() and not evals and not traces:
        raise ReportError(f"{run_dir} holds no metrics.jsonl, eval/*.json or profile/ traces: nothing to report")
    rows = read_metrics(run_dir, missing) if (run_dir / "metrics.jsonl").is_file() else []
    order = cfg.get("stages") or []
    stages = by_stage(rows, order)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:   # --out names a file, or a folder under one
        raise ReportError(f"{out}: cannot write the report there ({e.strerror or e})") from None
    device = (cfg.get("learner") or {}).get("device", "cpu")
    max_stale = (cfg.get("loop") or {}).get("max_staleness")
    md = [f"# memr1 report: {run_dir}", ""]
    figs: list[tuple[str, str]] = []   # (file, one line on what it shows)
    summary = {"run_dir": str(run_dir), "stages": {}, "figures": [], "evals": {}, "profile": []}
    body: list[str] = []

    for name in order:
        steps = ((cfg.get("stage") or {}).get(name) or {}).get("steps")
        got = len(stages.get(name, {}).get("rows", [])) + stages.get(name, {}).get("skipped", 0)
        if name not in stages:
            missing.append(f"stage {name}: no step logged (not started, or the run stopped before it)")
        elif steps and got < steps:
            missing.append(f"stage {name}: {got} of {steps} steps logged (stopped, crashed or still running)")
    for name, s in stages.items():
        if s["skipped"]:
            missing.append(f"stage {name}: {s['skipped']} step(s) skipped after rollout failures")
        trained = [r for r in s["rows"] if not r.get("profiled")]
        summary["stages"][name] = throughput.summarize(trained, device)
        if not s["rows"]:
            continue
        body += [f"## Stage {name}", ""]
        keys = [k for k in CURVE_KEYS[:1] if any(k in r for r in s["rows"])]
        keys += sorted({k for r in s["rows"] for k in r if k.startswith("reward_") and k != "reward_mean"})
        keys += [k for k in CURVE_KEYS[1:] if any(k in r for r in s["rows"])]
        keys = keys or [k for k in ("loss", "nll") if any(k in r for r in s["rows"])]
        if keys:
            f = f"curves_{name}.png"
            figures.learning_curves(name, s["starts"] + s["rows"], keys, out / f)   # starts: val dots only
            figs.append((f, f"{name}: {', '.join(keys)} per step, raw (faint) and smoothed; val_* as dots; "
                            f"probe_* (greedy, fixed held-out train items) as a green line"))
        if any("ops_add" in r for r in s["rows"]):
            f = f"ops_{name}.png"
            figures.op_mix(name, s["rows"], out / f)
            figs.append((f, f"{name}: ADD/UPDATE/DELETE/NONE ops per sampled completion, stacked, per step"))
        f = f"time_{name}.png"
        figures.step_time(name, s["rows"], out / f, max_stale)
        figs.append((f, f"{name}: seconds per step by phase (stacked) with the wall time; tokens/s of "
                        f"generation, frozen answers and training; staleness of each consumed rollout"))
        body += [f"![{f}]({f})" for f, _ in figs if f.endswith(f"_{name}.png")] + [""]
    if rows:
        summary["overall"] = throughput.summarize([r for s in stages.values() for r in s["rows"]
                                                   if not r.get("profiled")], device)
        md += ["## Throughput", "", *throughput_table(summary["stages"]), "",
               "Shares are of each stage's wall time (generate and score run beside train when "
               "loop.max_staleness > 0, so they may add to more than 100%); profiled steps are left out. "
               f"MFU: {summary['overall']['mfu_note']}.", ""]

    body += _eval_section(run_dir, cfg, evals, out, figs, summary, missing)
    body += profile_section(cfg, stages, traces, summary, missing)
    summary["figures"] = [{"file": f, "shows": d} for f, d in figs]
    summary["missing"] = missing
    md[2:2] = ["## Missing", "", *([f"- {m}" for m in missing] or ["- nothing"]), ""]
    md += body + ["## Figures", "", *[f"- `{f}`: {d}" for f, d in figs], "",
                  f"_written in {time.perf_counter() - t0:.1f} s_", ""]
    write_atomic(out / "summary.json", json.dumps(summary, indent=1, default=str))
    write_atomic(out / "report.md", "\n".join(md))
    return out / "report.md"


def _eval_section(run_dir: Path, cfg: dict, evals: dict, out: Path, figs: list, summary: dict,
                  missing: list[str]) -> list[str]:
    split = cfg.get("eval_split", "val")
    for label in cfg.get("eval_after") or []:
        if label != "warm" and f"{split}.{label}" not in evals:
            missing.append(f"eval/{split}.{label}.json: none (eval_after runs when every stage finished)")
    if not evals:
        return []
    lines = ["## Evaluation", ""]
    for name, r in evals.items():
        lines += eval_table(name, r)
        summary["evals"][name] = r["metrics"].get("overall")
    main = {n: r for n, r in evals.items() if n.partition(".")[2] in ("", *POLICIES)} or evals
    order = {p: i for i, p in enumerate(("",) + POLICIES)}   # each split's base, warm, trained in turn
    main = dict(sorted(main.items(), key=lambda kv: (kv[0].split(".")[0], order.get(kv[0].partition(".")[2], 9), kv[0])))
    resamples = min(RESAMPLES, (cfg.get("eval") or {}).get("resamples", RESAMPLES))
    f = "eval_categories.png"
    figures.eval_categories({n: category_cells(r, resamples) for n, r in main.items()}, out / f)
    figs.append((f, f"F1 and EM per category and overall of {', '.join(main)}, with 95% bootstrap whiskers"))
    lines.append(f"![{f}]({f})")
    compared = read_comparisons(run_dir, missing)
    pairs = {}
    for i, a in enumerate(POLICIES):
        for b in POLICIES[i + 1:]:
            for s in sorted({n.split(".")[0] for n in main}):
                if f"{s}.{a}" in main and f"{s}.{b}" in main:
                    pairs[f"{b} - {a}"] = delta_cells(main[f"{s}.{a}"], main[f"{s}.{b}"], compared.get(f"{b} - {a}"),
                                                      resamples)
    if pairs:
        f = "eval_deltas.png"
        figures.eval_deltas(pairs, out / f)
        figs.append((f, f"paired F1 and EM differences ({', '.join(pairs)}) per category and overall, "
                        f"with 95% bootstrap whiskers"))
        lines.append(f"![{f}]({f})")
    f = "eval_latency.png"
    figures.latency(main, out / f)
    figs.append((f, "latency per manager call, per search and per answer of each eval (box: quartiles, "
                    "whiskers 1.5 IQR; dots: p50/p95 of a report without samples)"))
    if not any((r.get("latency") or {}).get("answer", {}).get("samples_s") for r in main.values()):
        missing.append("eval latency samples: none (reports written before samples were kept): p50/p95 only")
    return lines + [f"![{f}]({f})", ""]


def report_cli(args) -> int:
    try:
        path = write_report(Path(args.run_dir), Path(args.out) if args.out else None)
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    shown = ("Missing", "Throughput", "Profiler traces")   # the figures and eval tables stay in the file
    for section in path.read_text().split("\n## ")[1:]:
        if section.startswith(shown):
            print(f"## {section.rstrip()}\n")
    print(f"wrote {path}")
    return 0


def report_quietly(run_dir: Path) -> None:
    """The report at the end of `memr1 train` / `memr1 eval`: best effort, one line either way."""
    try:
        print(f"report: {write_report(run_dir)}")
    except Exception as e:   # noqa: BLE001 - a report must never fail the run it describes
        print(f"warning: no report ({type(e).__name__}: {e})")
