"""`memr1 report` on hostile run folders: whatever a run folder holds, the report is written from what
reads (each unreadable part named under Missing), or the command fails with one `error:` line and exit
status 2; never a traceback (issue 35)."""
import json

import pytest

from memr1.engine.cli import main
from report_fixture import make_run


def metrics_line(d, row):
    with open(d / "metrics.jsonl", "ab") as f:
        f.write(row if isinstance(row, bytes) else json.dumps(row).encode() + b"\n")


def step(**over) -> dict:
    return {"stage": "manager", "step": 4, "reward_mean": 0.5, "step_s": 1.0, "gen_s": 0.5, **over}


def eval_edit(d, change):
    path = d / "eval" / "val.base.json"
    report = json.loads(path.read_text())
    change(report)
    path.write_text(json.dumps(report))


HOSTILE = {
    "config.toml not TOML": lambda d: (d / "config.toml").write_text("[stage\n"),
    "config.toml not UTF-8": lambda d: (d / "config.toml").write_bytes(b"name = \"\xff\"\n"),
    "config.toml 5,000-digit integer": lambda d: (d / "config.toml").write_text("seed = " + "9" * 5000 + "\n"),
    "config.toml stages not a list": lambda d: (d / "config.toml").write_text("stages = 3\n"),
    "config.toml stage not a table": lambda d: (d / "config.toml").write_text('stages = ["manager"]\nstage = "x"\n'),
    "config.toml steps a string": lambda d: (d / "config.toml").write_text(
        'stages = ["manager"]\n[stage.manager]\nsteps = "many"\n'),
    "config.toml learner not a table": lambda d: (d / "config.toml").write_text('learner = 1\neval = [1]\n'),
    "metrics line not UTF-8": lambda d: metrics_line(d, b'{"stage": "manager", "step": 5, "x": "\xff"}\n'),
    "metrics step not a number": lambda d: metrics_line(d, step(step="four")),
    "metrics step a float": lambda d: metrics_line(d, step(step=2.5)),
    "metrics stage not a string": lambda d: metrics_line(d, step(stage=["manager"])),
    "metrics value 1e308": lambda d: metrics_line(d, step(reward_mean=1e308, step_s=1e308, gen_s=1e308)),
    "metrics value NaN": lambda d: metrics_line(d, b'{"stage": "manager", "step": 4, "step_s": NaN, "gen_s": Infinity}\n'),
    "metrics value a string": lambda d: metrics_line(d, step(step_s="slow", reward_mean="high")),
    "metrics line nested deep": lambda d: metrics_line(d, b"[" * 100_000 + b"\n"),
    "eval answers not a list": lambda d: eval_edit(d, lambda r: r.update(answers="x")),
    "eval metrics a list": lambda d: eval_edit(d, lambda r: r.update(metrics=[])),
    "eval answer without scores": lambda d: eval_edit(d, lambda r: r["answers"][0].pop("f1")),
    "eval report not UTF-8": lambda d: (d / "eval" / "val.base.json").write_bytes(b"\xff{"),
    "eval report nested deep": lambda d: (d / "eval" / "val.base.json").write_text("[" * 100_000),
    "eval summary a list": lambda d: (d / "eval" / "summary.json").write_text("[]"),
    "eval summary not JSON": lambda d: (d / "eval" / "summary.json").write_text("{"),
    "profile trace not JSON": lambda d: next((d / "profile").glob("*/step_*.json")).write_text("{"),
    "a manifest.json nested deep": lambda d: (d / "manifest.json").write_text("[" * 100_000),
    "profile trace a list": lambda d: next((d / "profile").glob("*/step_*.json")).write_text("[1]"),
}


@pytest.mark.parametrize("damage", list(HOSTILE))
def test_a_hostile_run_folder_is_reported_or_one_error_line(tmp_path, capsys, damage):
    run = make_run(tmp_path / "run", steps=4)
    HOSTILE[damage](run)
    code = main(["report", str(run)])
    out, err = capsys.readouterr()
    if code == 2:
        assert err.startswith("error: ") and err.count("\n") == 1, err
    else:
        assert code == 0 and (run / "report" / "report.md").is_file() and "wrote" in out


def test_out_naming_a_file_is_one_error_line(tmp_path, capsys):
    run = make_run(tmp_path / "run", steps=4)
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file", tmp_path / "file" / "sub"):
        assert main(["report", str(run), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and str(tmp_path / "file") in err, err
