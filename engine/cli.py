"""`memr1` command line. Each command's handler lives next to the code it drives and is imported
only when that command runs, so `memr1 --help` stays fast and needs no torch import."""
import argparse
import importlib
import sys

# command path -> "module:function"; each function takes the parsed args and returns an exit code.
HANDLERS = {
    ("model", "prepare"): "memr1.engine.generation.model:prepare_cli",
    ("data", "synth"): "memr1.rl.task.data.synth_cli:synth_cli",
    ("data", "stats"): "memr1.rl.task.data.locomo:stats_cli",
    ("eval", None): "memr1.engine.evaluate:eval_cli",
    ("train", None): "memr1.engine.train:train_cli",
    ("rollout", None): "memr1.engine.rollout:rollout_cli",
    ("report", None): "memr1.engine.rollout_report:report_cli",
}


def model_args(p: argparse.ArgumentParser, rest: str) -> None:
    """--config and the checkpoints of the two trained roles (memr1 eval, memr1 rollout)."""
    p.add_argument("--config", required=True, help="a TOML file, e.g. configs/default.toml")
    p.add_argument("--checkpoint", help="an HF checkpoint (manager and answer agent) or a `memr1 train` run dir "
                   "(each role's final checkpoint)" + rest)
    p.add_argument("--manager", help="an HF checkpoint for the manager alone (overrides --checkpoint's)")
    p.add_argument("--answer", help="an HF checkpoint for the answer agent alone (overrides --checkpoint's)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="memr1", description="Memory-R1 trainer: RL for memory agents.")
    p.add_argument("--verbose", action="store_true", help="show every library's log lines and warnings (by default "
                   "vLLM's INFO lines and known-harmless warnings go to RUN_DIR/run.log only)")
    sub = p.add_subparsers(dest="command", required=True)

    model = sub.add_parser("model", help="manage the embedded default model").add_subparsers(
        dest="action", required=True)
    prep = model.add_parser("prepare", help="convert SmolLM2-135M-Instruct to an HF checkpoint once")
    prep.add_argument("--force", action="store_true", help="convert again even if cached")

    tr = sub.add_parser("train", help="train the configured stages in order (warm starts, RL, controls), then "
                        "evaluate (eval_after)")
    tr.add_argument("--config", help="a TOML file, e.g. configs/default.toml")
    tr.add_argument("--resume", metavar="RUN_DIR", help="continue runs/<name> from its last checkpoint")
    tr.add_argument("--allow-config-change", metavar="KEY[,KEY...]", action="append",
                    help="with --resume: config keys (or sections) the overrides may change from the run's config.toml")
    tr.add_argument("--dry-run", action="store_true", help="print the plan and memory estimate, start nothing")
    tr.add_argument("--from-rollouts", metavar="DIR", nargs="+", default=None,
                    help="train the stage these `memr1 rollout` folders were written for on their recorded "
                         "rollouts, one step per recorded step, instead of generating")
    tr.add_argument("--profile", action="store_true", help="torch.profiler traces of steps 2 and 3 of each stage "
                    "(unless profile.steps is set), in RUN_DIR/profile/<stage>/")
    tr.add_argument("overrides", nargs="*", help="key=value config overrides, e.g. loop.max_staleness=1")

    ev = sub.add_parser("eval", help="build banks, answer a split, and print the paper's table")
    model_args(ev, "; extraction and the local judge keep the base model")
    ev.add_argument("--compare", metavar="REPORT", help="an earlier eval report of the same split: print the "
                    "paired difference of each metric with a seeded bootstrap interval")
    ev.add_argument("--split", default="val", choices=["train", "val", "test"])
    ev.add_argument("overrides", nargs="*", help="key=value config overrides, e.g. eval.baseline=rag")

    ro = sub.add_parser("rollout", help="a stage's rollouts with given checkpoints, as Parquet shards (trains nothing)")
    model_args(ro, "; a role without one keeps the base model")
    ro.add_argument("--stage", required=True, help="manager, answer or manager_episode")
    ro.add_argument("--split", default="train", choices=["train", "val", "test"])
    ro.add_argument("--out", required=True, help="the output folder; a rerun with the same command skips "
                    "finished shards")
    ro.add_argument("--items", type=int, help="at least this many items, in whole steps of the stage's "
                    "prompts_per_step (default: every item of a val or test split once)")
    ro.add_argument("--group-size", type=int, help="completions per prompt (default: the stage's group_size)")
    ro.add_argument("overrides", nargs="*", help="key=value config overrides, e.g. rollout.temperature=0.7")

    rep = sub.add_parser("report", help="plots, throughput summary and profiler tables of a run, an eval or a "
                         "rollout folder")
    rep.add_argument("run_dir", metavar="RUN_DIR", help="a `memr1 train` run directory, an eval's run_dir or a "
                     "`memr1 rollout` folder")
    rep.add_argument("--out", help="where report.md, summary.json and the PNGs go (default RUN_DIR/report)")

    data = sub.add_parser("data", help="data sets").add_subparsers(dest="action", required=True)
    synth = data.add_parser("synth", help="write the synthetic multi-session set (LoCoMo format)")
    synth.add_argument("--out", required=True)
    synth.add_argument("--conversations", type=int, default=20)
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--kind", choices=("synthetic", "budget"), default="synthetic",
                       help="the default set, or the budgeted task's (rl/task/data/budget.py)")
    stats = data.add_parser("stats", help="count conversations, sessions, turns and QA of a LoCoMo file")
    stats.add_argument("path")
    stats.add_argument("--json", action="store_true")
    return p


# User errors: bad config, data or checkpoint. Any command prints them as one line and exits 2; any
# other exception is a bug and keeps its traceback.
USER_ERRORS = {"memr1.engine.config.errors": "ConfigError", "memr1.rl.task.data.locomo": "DataError",
               "memr1.engine.checkpoints.files": "CheckpointError", "memr1.engine.rollout_files": "RolloutDirError"}


def user_errors() -> tuple:
    # Only modules already imported can have raised: no import (and no torch) just to catch.
    return tuple(getattr(sys.modules[m], name) for m, name in USER_ERRORS.items() if m in sys.modules)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from memr1.engine.observe import quiet
    quiet.setup(args.verbose)
    key = (args.command, getattr(args, "action", None))
    module, func = HANDLERS[key].split(":")
    try:
        return int(getattr(importlib.import_module(module), func)(args) or 0)
    except user_errors() as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def run() -> None:
    """The `memr1` program (console script): restart once with the CPU libraries preloaded, then run."""
    from memr1.engine.preload import preload

    preload()
    sys.exit(main())


if __name__ == "__main__":
    run()
