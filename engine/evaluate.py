"""`memr1 eval`: evaluate one split with the checkpoints the flags name (eval_split.py writes
`<run_dir>/eval/<split>[.<label>].json` and prints the paper's table) and, with --compare, print the
paired differences against another report of the same split, with bootstrap intervals.
"""
import json
import sys
from pathlib import Path

from memr1.engine.assembly import cli_models
from memr1.engine.config.errors import ConfigError
from memr1.engine.config.resolve import resolve
from memr1.engine.config.run import load_config
from memr1.engine.eval_split import run_eval


def eval_cli(args) -> int:
    try:
        cfg = load_config(args.config, list(getattr(args, "overrides", None) or []))
        models = cli_models(args)
        out = run_eval(resolve(cfg, 0, 1, trains=False), split=args.split, models=models)
        if getattr(args, "compare", None):
            print_comparison(Path(args.compare), out, cfg.eval.resamples, cfg.seed)
    except (ConfigError, ValueError, FileNotFoundError, ImportError) as e:   # bad config, data, checkpoint
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    from memr1.engine.observe.report import report_quietly
    report_quietly(out.parent.parent)   # <run_dir>/eval/<name>.json -> <run_dir>
    return 0


def print_comparison(before: Path, after: Path, resamples: int, seed: int) -> dict:
    """Paired differences (after - before) of two reports of one split, printed and returned."""
    from memr1.rl.task.eval.stats import compare_reports, format_comparison
    a, b = (json.loads(Path(p).read_text()) for p in (before, after))
    rows = compare_reports(a, b, resamples, seed)
    print(format_comparison(rows, f"paired difference, {after.name} - {before.name} (points, seeded bootstrap)"))
    return rows
