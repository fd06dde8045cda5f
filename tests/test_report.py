"""`memr1 report` on synthetic run directories (tests/report_fixture.py): every figure is a real PNG
with data in it and named in report.md; a crashed run says what is missing; an eval alone; the
throughput summary's arithmetic; bad input."""
import json
import math

import numpy as np
import pytest
from PIL import Image

from memr1.engine.cli import main
from memr1.engine.observe import figures, report, throughput
from report_fixture import eval_report, make_run

PLOTS = ("learning_curves", "op_mix", "step_time", "eval_categories", "eval_deltas", "latency")


@pytest.fixture
def plotted(monkeypatch):
    """PNG file name -> the series its figure function returned."""
    got = {}
    for name in PLOTS:
        def wrapped(*args, _real=getattr(figures, name), **kw):
            series = _real(*args, **kw)
            got[[a for a in args if hasattr(a, "suffix")][0].name] = series
            return series
        monkeypatch.setattr(figures, name, wrapped)
    return got


def check_pngs(out, plotted):
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == sorted(plotted)
    md = (out / "report.md").read_text()
    for name in pngs:
        assert f"`{name}`" in md, f"report.md does not name {name}"
        with Image.open(out / name) as im:
            im.verify()
        with Image.open(out / name) as im:
            assert im.format == "PNG" and im.size[0] > 300 and im.size[1] > 200
        assert plotted[name], f"{name}: nothing plotted"
        for label, (x, y) in plotted[name].items():
            y = np.asarray(y, dtype=float)
            assert len(x) == len(y) > 0 and np.isfinite(y).any(), f"{name}: series {label!r} is empty"
    return md


def test_a_full_run_renders_every_figure_with_data(tmp_path, plotted):
    run = make_run(tmp_path / "run", steps=12)
    md_path = report.write_report(run)
    out = md_path.parent
    md = check_pngs(out, plotted)
    assert {"curves_manager.png", "ops_manager.png", "time_manager.png", "curves_answer.png", "time_answer.png",
            "eval_categories.png", "eval_deltas.png", "eval_latency.png"} == set(plotted)
    curves = plotted["curves_manager.png"]
    for key in ("reward_mean", "reward_em", "reward_format", "reward_invalid_op", "em_mean", "f1_mean",
                "parse_failure_rate", "capped_rate", "reward_mean (smoothed)", "val_em_mean"):
        assert key in curves, key
    assert len(curves["reward_mean"][0]) == 11   # 12 steps, one skipped
    assert {"ops_add", "ops_update", "ops_delete", "ops_none"} == set(plotted["ops_manager.png"])
    timing = plotted["time_manager.png"]
    assert {"generate_s", "score_s", "train_s", "sync_s", "step_s", "staleness", "tokens_per_s generate",
            "tokens_per_s frozen answers", "tokens_per_s train (positions)"} <= set(timing)
    assert set(plotted["eval_deltas.png"]) == {f"{m} {p}" for m in ("f1", "em")
                                               for p in ("warm - base", "trained - base", "trained - warm")}
    # the trace tables, and what is missing: the skipped step
    assert "| learner_forward | 1 | 0.3 |" in md and "`aten::addmm` | 1 | 0.30 | 0.30" in md
    assert "`aten::linear` | 1 | 0.10 | 0.40" in md   # self time leaves out the nested addmm
    summary = json.loads((out / "summary.json").read_text())
    assert "stage manager: 1 step(s) skipped after rollout failures" in summary["missing"]
    m = summary["stages"]["manager"]
    assert m["steps"] == 10   # the profiled step is left out of the throughput
    for key in ("rollouts_per_s", "forks_per_s", "bank_ops_per_s", "sync_gb_per_s"):
        assert m[key] > 0, key
    assert all(m["tokens_per_s"][k] > 0 for k in ("generate", "frozen_answers", "train"))
    assert m["mfu"] is None and "CPU" in m["mfu_note"]
    assert summary["evals"]["val.trained"]["n"] == 40


def test_a_crashed_run_reports_what_it_has_and_what_is_missing(tmp_path, plotted):
    run = make_run(tmp_path / "run", steps=12, crashed=True)
    out = report.write_report(run, tmp_path / "out").parent
    assert out == tmp_path / "out"
    check_pngs(out, plotted)
    missing = json.loads((out / "summary.json").read_text())["missing"]
    assert "stage answer: 6 of 12 steps logged (stopped, crashed or still running)" in missing
    assert any("1 unreadable line(s)" in m for m in missing)
    assert any(m.startswith("eval/val.trained.json: none") for m in missing)
    assert "profile: no trace of stage manager step 2" in missing
    assert not any(n.startswith("eval_") for n in plotted)


def test_an_eval_alone_gets_its_table_and_latencies(tmp_path, plotted, capsys):
    (tmp_path / "eval").mkdir()
    rep = eval_report("trained", 0.3, __import__("random").Random(1))
    (tmp_path / "eval" / "val.json").write_text(json.dumps(rep))
    old = dict(rep, latency={k: {"p50_s": 0.1, "p95_s": 0.3, "n": 4} for k in ("manager", "search", "answer")})
    (tmp_path / "eval" / "test.json").write_text(json.dumps(old))   # written before samples were kept
    assert main(["report", str(tmp_path)]) == 0
    out = tmp_path / "report"
    md = check_pngs(out, plotted)
    assert set(plotted) == {"eval_categories.png", "eval_latency.png"}
    assert "| single-hop |" in md and "**val**" in md and "**test**" in md
    assert "answer test p50/p95" in plotted["eval_latency.png"]
    assert "eval latency samples" not in md   # one report has them
    assert "wrote" in capsys.readouterr().out


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert main(["report", str(tmp_path)]) == 2   # an empty folder: nothing to report
    assert "nothing to report" in capsys.readouterr().err
    report.report_quietly(tmp_path / "nope")   # at the end of train / eval: a warning, never a raise
    assert capsys.readouterr().out.startswith("warning: no report")


def test_throughput_shares_rates_and_mfu():
    rows = [{"step": 1, "step_s": 10.0, "gen_s": 4.0, "score_s": 1.0, "train_s": 3.0, "sync_s": 1.0,
             "sync_wait_s": 0.5, "response_tokens": 400, "positions": 3000, "completions": 20, "forks": 20,
             "bank_ops": 30, "fork_s": 0.5, "model_flops": 3e12, "peak_flops": 1e12}]
    s = throughput.summarize(rows, "cuda")
    assert s["phase_s"] == {"generate": 4.0, "score": 1.0, "train": 3.0, "sync": 1.5, "validate": 0.0, "other": 0.5}
    assert s["phase_share"]["generate"] == 0.4 and s["tokens_per_s"]["generate"] == 100.0
    assert s["tokens_per_s"]["train"] == 1000.0 and s["rollouts_per_s"] == 2.0
    assert s["bank_ops_per_s"] == 3.0 and s["bank_ops_per_apply_s"] == 60.0
    assert math.isclose(s["mfu"], 1.0)
    rows[0].pop("peak_flops")
    assert throughput.summarize(rows, "cuda")["mfu"] is None
    assert "table" in throughput.summarize(rows, "cuda")["mfu_note"]
    assert throughput.bf16_peak("NVIDIA H200") == 989e12 and throughput.bf16_peak("NVIDIA L40S") == 362e12
    assert throughput.bf16_peak("AMD EPYC") is None


def test_smoothing_averages_short_runs_too():
    from memr1.engine.observe.figures import smooth
    y = np.array([0.0, 3.0, 0.0, 3.0, 0.0, 3.0, 0.0, 3.0, 0.0, 3.0, 0.0, 3.0, 0.0, 3.0, 0.0])  # a 15-step stage
    s = smooth(y)
    assert s.shape == y.shape and s[0] == y[0]
    assert np.allclose(s[2:], [np.mean(y[i - 2:i + 1]) for i in range(2, len(y))])  # trailing mean of 3
    assert np.array_equal(smooth(y[:5]), y[:5])                                     # too short to smooth
