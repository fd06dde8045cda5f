"""`memr1 report DIR` on a rollout folder: report.md and PNGs from its summary (rollout_summary.py);
a run or eval folder goes to observe/report.py.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from memr1.engine.rollout_files import MANIFEST_KIND, RolloutDirError, read_completions, read_manifest
from memr1.engine.rollout_summary import summarize
from memr1.rl.fileio import read_regular, write_atomic


def is_rollout_dir(path: Path) -> bool:
    try:
        return json.loads(read_regular(path / "manifest.json", 64 << 20)).get("kind") == MANIFEST_KIND
    except (OSError, ValueError, AttributeError, RecursionError):   # any file at all, a FIFO: not a rollout folder
        return False


def fmt(v, spec: str = ".3f") -> str:
    return "–" if v is None else format(v, spec)


def write_report(path: Path, out_dir: Path | None = None) -> Path:
    """report.md and two figures of a rollout folder (its summary.json, else computed now)."""
    from memr1.engine.observe.figures import rollout_figures

    default = out_dir is None
    out_dir = out_dir or path / "report"
    manifest = read_manifest(path, "RUN_DIR")
    summary = summarize(path, write=False)
    what = manifest["what"]
    make_out_dir(out_dir, default)
    table = read_completions(path, ["events", "status", "reward"]).to_pylist()
    figs = rollout_figures(table, summary["phases"]["seconds"], out_dir)
    c, t, r = summary["counts"], summary["throughput"], summary["reward"]
    lines = [f"# Rollouts: stage {what.get('stage')}, split {what.get('split')}", "",
             f"{c['rows']} completions in {c['groups']} groups, {c['steps']} steps, {c['items']} items of "
             f"{c['conversations']} conversations; commit {manifest.get('commit')}.", "",
             "Models: " + ", ".join(f"{role} `{(manifest.get('paths') or {}).get(role, '?')}` (sha256 {str(digest)[:12]})"
                                    for role, digest in (what.get("models") or {}).items()), "",
             "## Throughput", "", "| rollouts/s | generated tokens/s | forks/s | bank ops/s | write share | set-up s |",
             "|---|---|---|---|---|---|",
             f"| {fmt(t.get('rollouts_per_s'), '.2f')} | {fmt(t.get('generated_tokens_per_s'), '.1f')} | "
             f"{fmt(t.get('forks_per_s'), '.2f')} | {fmt(t.get('bank_ops_per_s'), '.2f')} | "
             f"{fmt(t.get('write_share'))} | {fmt(t.get('setup_s'), '.1f')} |", "",
             "## Time per phase", "", "| phase | seconds | share |", "|---|---|---|"]
    lines += [f"| {k} | {v:.2f} | {fmt(summary['phases']['share'][k])} |" for k, v in summary["phases"]["seconds"].items()]
    lines += ["", "## Reward per op kind", "",
              f"All: mean {fmt(r['mean'])}, variance {fmt(r['var'])}; zero-variance groups "
              f"{fmt(r['zero_variance_groups'])}.", "", "| op kind | completions | mean | variance |", "|---|---|---|---|"]
    lines += [f"| {k} | {m['n']} | {fmt(m['mean'])} | {fmt(m['var'])} |" for k, m in r["by_op"].items()]
    lines += ["", "## Op mix", "", "| event | per completion |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in summary["ops"]["per_completion"].items()]
    lines += ["", "| status | share |", "|---|---|"] + [f"| {k} | {v:.3f} |" for k, v in summary["ops"]["status"].items()]
    lines += ["", "## Figures", ""] + [f"![{name}]({name})" for name in figs]
    report = out_dir / "report.md"
    try:
        write_atomic(report, "\n".join(lines) + "\n")
    except OSError as e:
        raise RolloutDirError(f"--out {out_dir}: cannot write the report there ({e.strerror or e})") from None
    return report


def make_out_dir(out_dir: Path, default: bool) -> None:
    """The report's folder, created; RolloutDirError when it cannot be. The default one (inside the
    folder reported on, which anyone may have written) must be a real folder, not a link elsewhere."""
    if default and out_dir.is_symlink():
        raise RolloutDirError(f"{out_dir} is a symbolic link; remove it or give --out")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:   # a file, a folder under one, /proc, read-only
        raise RolloutDirError(f"--out {out_dir}: cannot write the report there ({e.strerror or e})") from None


def report_cli(args) -> int:
    """`memr1 report DIR`: a rollout folder here, a run or eval folder in observe/report.py."""
    from memr1.engine.observe import report

    path = Path(args.run_dir)
    if not is_rollout_dir(path):
        return report.report_cli(args)
    try:
        written = write_report(path, Path(args.out) if args.out else None)
    except RolloutDirError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(written.read_text().split("\n## Figures")[0])
    print(f"wrote {written}")
    return 0
