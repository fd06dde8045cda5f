"""The end of `memr1 train`: evaluate the base, warm-started, trained and control policies on the
held-out split, and compare them pairwise over the same questions with seeded bootstrap intervals
clustered by conversation (rl/task/eval/stats.py).

For each policy in `eval_after` (base = the untrained model in both roles, warm = each role's warm
start, trained = each role's final checkpoint, control = each role's supervised control, the warm
start trained further on the RL stage's prompts, rs = each role's rejection-sampling control, the warm
start trained on the best of the RL stage's own rollouts):
  eval/<split>.<policy>.json               the full pipeline (extraction or oracle facts, the policy's
                                           manager building banks, its answer agent answering)
  eval/<split>.<policy>.oracle_banks.json  synthetic data: the answer agent alone, on the oracle's banks
and, when a manager and an answer agent were trained, the manager measured on what its reward
optimises: the trained answer agent, fixed, on every other policy's manager's banks (the banks are
cached by manager, so each costs one answer pass)
  eval/<split>.trained_answer.<policy>_manager.json
and each control's answer agent on the warm manager's banks (beside the warm pipeline and the trained
answer agent there, the answer agent measured on the banks its stage trained on when the warm manager
built them, as in the outcome-only recipe)
  eval/<split>.<control>_answer.warm_manager.json
With "add_all" in eval_after, the trained answer agent also answers from ADD-every-fact banks (every
extracted fact ADDed, nothing updated or deleted: the rule a learned manager must beat)
  eval/<split>.trained_answer.add_all_manager.json
eval/summary.json holds every row and comparison; the table is printed last.
"""
import json
from pathlib import Path

from memr1.engine.config.stages import stage_name
from memr1.engine.eval_split import run_eval
from memr1.rl.task.eval.scoring import OP_ACCURACY_VARIANTS
from memr1.rl.task.eval.stats import ci_text, compare_reports

ROWS = ("base", "warm", "trained", "control", "rs")
# (a, b) pairs compared as b - a, over the full pipeline and over the oracle's banks
PAIRS = (("base", "warm"), ("base", "trained"), ("warm", "trained"), ("control", "trained"), ("base", "control"),
         ("warm", "control"), ("rs", "trained"), ("warm", "rs"))


def policies(run, finals: dict[str, Path]) -> dict[str, dict]:
    """policy -> {role: checkpoint} for the policies eval_after names that this run has."""
    out = {}
    for which in run.cfg.eval_after:
        if which == "add_all":
            continue   # not a policy: the trained answer agent on ADD-every-fact banks (evaluate_after)
        if which == "base":
            out["base"] = {}
        elif which in ("warm", "control", "rs"):   # each role's stage of that kind
            found = {stage_name(name).role: path for name, path in finals.items() if stage_name(name).kind == which}
            if found:
                out[which] = found
        else:
            trained = {}
            for name, path in finals.items():   # in stage order: each role's last stage wins (controls aside)
                if not stage_name(name).baseline:
                    trained[stage_name(name).role] = path
            out["trained"] = trained
    return out


def warm_banks(label: str) -> str:
    """The report label of `label`'s answer agent on the warm manager's banks."""
    return "warm" if label == "warm" else "trained_answer.warm_manager" if label == "trained" else \
        f"{label}_answer.warm_manager"


def fixed_answerer(label: str) -> str:
    """The report label of the trained answer agent on `label`'s manager's banks."""
    return "trained" if label == "trained" else f"trained_answer.{label}_manager"


def evaluate_after(run, finals: dict[str, Path], generator) -> dict:
    cfg, split = run.cfg, run.cfg.eval_split
    has_oracle = not cfg.data.path
    reports: dict[str, Path] = {}
    pols = policies(run, finals)
    for label, models in pols.items():
        reports[label] = run_eval(run, split, models, generator, label, baseline="base" if label == "base" else "memr1")
        if has_oracle:
            reports[f"{label}.oracle_banks"] = run_eval(run, split, {k: v for k, v in models.items() if k == "answer"},
                                                        generator, f"{label}.oracle_banks", baseline="oracle")
    trained = pols.get("trained", {})
    if "manager" in trained and "answer" in trained:
        for label, models in pols.items():
            if label != "trained":
                manager = {"manager": models["manager"]} if "manager" in models else {}
                reports[fixed_answerer(label)] = run_eval(run, split, {**manager, "answer": trained["answer"]},
                                                          generator, fixed_answerer(label), baseline="memr1")
    warm = pols.get("warm", {})
    if "manager" in warm and "answer" in trained:   # each answer agent on the warm manager's banks (what it trained on
        for label in ("control", "rs"):               # when the warm manager built its stage's banks)
            if "answer" in pols.get(label, {}):
                reports[warm_banks(label)] = run_eval(run, split, {"manager": warm["manager"],
                                                                   "answer": pols[label]["answer"]},
                                                      generator, warm_banks(label), baseline="memr1")
    if "answer" in trained and "add_all" in cfg.eval_after:   # the rule a manager must beat: ADD every fact
        reports[fixed_answerer("add_all")] = run_eval(run, split, {"answer": trained["answer"]}, generator,
                                                      fixed_answerer("add_all"), baseline="add_all")
    summary = summarize(reports, cfg.eval.resamples, cfg.seed)
    out = run.run_dir / "eval" / "summary.json"
    out.write_text(json.dumps(summary, indent=1))
    print(format_summary(summary, split))
    return {k: str(v) for k, v in reports.items()} | {"summary": str(out)}


def row_of(report: dict) -> dict:
    """A report's headline numbers, in points."""
    m, o, mgr = report["metrics"]["overall"], report.get("oracle") or {}, report.get("manager") or {}
    calls = mgr.get("calls") or 0
    pct = lambda x: None if x is None else 100 * x
    memories = list((mgr.get("final_memories") or {}).values())
    return {"em": m["em"], "f1": m["f1"], "bleu1": m["bleu1"], "j": m["j"], "n": m["n"],
            **{name: pct(o.get(name)) for name, *_ in OP_ACCURACY_VARIANTS},
            "parse_failure": 100 * mgr.get("status", {}).get("parse_error", 0) / calls if calls else None,
            "events": mgr.get("events"), "memories": sum(memories) / len(memories) if memories else None,
            "evidence_miss": pct((report.get("evidence") or {}).get("miss_rate")),
            "capped": {role: c["rate"] for role, c in report["capped"].items()}}


def summarize(reports: dict[str, Path], resamples: int, seed: int) -> dict:
    loaded = {k: json.loads(Path(p).read_text()) for k, p in reports.items()}
    rows = {label: row_of(r) for label, r in loaded.items()}
    comparisons = {}
    for suffix in ("", ".oracle_banks"):
        for a, b in PAIRS:
            if a + suffix in loaded and b + suffix in loaded:
                comparisons[f"{b}{suffix} - {a}{suffix}"] = compare_reports(loaded[a + suffix], loaded[b + suffix],
                                                                           resamples, seed)
    # the manager with the answer agent fixed: the trained manager's banks against each other manager's
    for label in (*ROWS, "add_all"):
        fixed = fixed_answerer(label)
        if label != "trained" and fixed in loaded and "trained" in loaded:
            comparisons[f"trained - {fixed}"] = compare_reports(loaded[fixed], loaded["trained"], resamples, seed)
    # the answer agents on the warm manager's banks: the trained one against the warm start and each control
    for a in ("warm", "control", "rs"):
        if warm_banks(a) in loaded and warm_banks("trained") in loaded and a != "trained":
            comparisons[f"{warm_banks('trained')} - {warm_banks(a)}"] = compare_reports(
                loaded[warm_banks(a)], loaded[warm_banks("trained")], resamples, seed)
    return {"rows": rows, "comparisons": comparisons, "cluster": "conversation"}


def format_summary(summary: dict, split: str) -> str:
    cell = lambda x: "-" if x is None else f"{x:.1f}"
    lines = [f"held-out {split} split (points; oracle_banks = the answer agent on the synthetic oracle's banks; "
             f"ev miss = questions whose evidence turns no memory came from)",
             f"{'policy':34} {'EM':>6} {'F1':>6} {'BLEU-1':>7} {'op acc':>7} {'ev miss':>7} {'n':>5}"]
    for label, r in summary["rows"].items():
        lines.append(f"{label:34} {cell(r['em']):>6} {cell(r['f1']):>6} {cell(r['bleu1']):>7} "
                     f"{cell(r['op_accuracy']):>7} {cell(r.get('evidence_miss')):>7} {r['n']:>5}")
    lines.append("paired differences, b - a, with 95% bootstrap intervals (conversations resampled):")
    for name, metrics in summary["comparisons"].items():
        parts = [f"{m} {r['delta']:+.1f} {ci_text(r)}" for m, r in metrics.items()
                 if r.get("delta") is not None and m in ("em", "f1", "op_accuracy", "op_accuracy_ids")]
        lines.append(f"  {name:48} " + "; ".join(parts))
    return "\n".join(lines)
