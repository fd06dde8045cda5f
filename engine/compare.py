"""The end of `memr1 train`: evaluate the base, warm-started and trained policies on the held-out
split, and compare them pairwise over the same questions with seeded bootstrap intervals.

For each policy in `eval_after` (base = the untrained model in both roles, warm = each role's warm
start, trained = each role's final checkpoint):
  eval/<split>.<policy>.json               the full pipeline (extraction or oracle facts, the policy's
                                           manager building banks, its answer agent answering)
  eval/<split>.<policy>.oracle_banks.json  synthetic data: the answer agent alone, on the oracle's banks
and, when both roles were trained, the paper's "without the RL manager" ablation:
  eval/<split>.trained_answer.base_manager.json   the trained answer agent on the base manager's banks
eval/summary.json holds every row and comparison; the table is printed last.
"""
import json
from pathlib import Path

from memr1.engine.evaluate import run_eval
from memr1.rl.stats import compare_reports

ROWS = ("base", "warm", "trained")


def policies(run, finals: dict[str, Path]) -> dict[str, dict]:
    """policy -> {role: checkpoint} for the policies eval_after names that this run has."""
    out = {}
    for which in run.cfg.eval_after:
        if which == "base":
            out["base"] = {}
        elif which == "warm":
            warm = {r: finals[f"{r}_warm"] for r in ("manager", "answer") if f"{r}_warm" in finals}
            if warm:
                out["warm"] = warm
        else:
            trained = {}
            for name, path in finals.items():   # in stage order: each role's last stage wins
                trained[name.split("_")[0]] = path
            out["trained"] = trained
    return out


def evaluate_after(run, finals: dict[str, Path], generator) -> dict:
    cfg, split = run.cfg, run.cfg.eval_split
    has_oracle = not cfg.data.path
    reports: dict[str, Path] = {}
    pols = policies(run, finals)
    for label, models in pols.items():
        reports[label] = run_eval(cfg, split, models, generator, label, baseline="base" if label == "base" else "memr1")
        if has_oracle:
            reports[f"{label}.oracle_banks"] = run_eval(cfg, split, {k: v for k, v in models.items() if k == "answer"},
                                                        generator, f"{label}.oracle_banks", baseline="oracle")
    trained = pols.get("trained", {})
    if "manager" in trained and "answer" in trained:
        reports["trained_answer.base_manager"] = run_eval(cfg, split, {"answer": trained["answer"]}, generator,
                                                          "trained_answer.base_manager", baseline="memr1")
    summary = summarize(reports, cfg.eval.resamples, cfg.seed)
    out = run.run_dir / "eval" / "summary.json"
    out.write_text(json.dumps(summary, indent=1))
    print(format_summary(summary, split))
    return {k: str(v) for k, v in reports.items()} | {"summary": str(out)}


def summarize(reports: dict[str, Path], resamples: int, seed: int) -> dict:
    loaded = {k: json.loads(Path(p).read_text()) for k, p in reports.items()}
    rows = {}
    for label, r in loaded.items():
        m, o, mgr = r["metrics"]["overall"], r.get("oracle") or {}, r.get("manager") or {}
        calls = mgr.get("calls") or 0
        rows[label] = {"em": m["em"], "f1": m["f1"], "bleu1": m["bleu1"], "j": m["j"], "n": m["n"],
                       "op_accuracy": None if o.get("op_accuracy") is None else 100 * o["op_accuracy"],
                       "parse_failure": 100 * mgr.get("status", {}).get("parse_error", 0) / calls if calls else None,
                       "capped": {role: c["rate"] for role, c in r["capped"].items()}}
    pairs = [(a, b) for i, a in enumerate(ROWS) for b in ROWS[i + 1:]]
    comparisons = {}
    for suffix in ("", ".oracle_banks"):
        for a, b in pairs:
            if a + suffix in loaded and b + suffix in loaded:
                comparisons[f"{b}{suffix} - {a}{suffix}"] = compare_reports(loaded[a + suffix], loaded[b + suffix],
                                                                           resamples, seed)
    if "trained_answer.base_manager" in loaded and "trained" in loaded:
        comparisons["trained - trained_answer.base_manager"] = compare_reports(
            loaded["trained_answer.base_manager"], loaded["trained"], resamples, seed)
    return {"rows": rows, "comparisons": comparisons}


def format_summary(summary: dict, split: str) -> str:
    cell = lambda x: "-" if x is None else f"{x:.1f}"
    lines = [f"held-out {split} split (points; oracle_banks = the answer agent on the synthetic oracle's banks)",
             f"{'policy':34} {'EM':>6} {'F1':>6} {'BLEU-1':>7} {'op acc':>7} {'n':>5}"]
    for label, r in summary["rows"].items():
        lines.append(f"{label:34} {cell(r['em']):>6} {cell(r['f1']):>6} {cell(r['bleu1']):>7} "
                     f"{cell(r['op_accuracy']):>7} {r['n']:>5}")
    lines.append("paired differences, b - a, with 95% bootstrap intervals:")
    for name, metrics in summary["comparisons"].items():
        parts = [f"{m} {r['delta']:+.1f} [{r['ci_low']:+.1f}, {r['ci_high']:+.1f}]" for m, r in metrics.items()
                 if r.get("delta") is not None and m != "bleu1"]
        lines.append(f"  {name:40} " + "; ".join(parts))
    return "\n".join(lines)
