"""bench.loop: legs alternate staleness 0, 1, 1, 0 and rows take medians of the timed steps; a --quick run
on the tiny model writes both rows with the gen/train balance and the JSON's provenance, and each mode's
wall time per step covers its rollouts."""
import json
import subprocess
import sys

import pytest

import memr1.bench.loop as loop_bench


def test_legs_alternate_and_rows_take_medians(monkeypatch):
    order = []

    def fake_leg(setup, staleness, steps):
        order.append(staleness)
        base = 1.0 + staleness + len(order) / 100   # distinct per leg, so the median picks a known value
        step = {"step_s": base, "gen_s": 2 * base, "train_s": base / 2, "sync_s": 0.1, "sync_wait_s": 0.0,
                "idle_s": 0.2, "response_tokens": 10}
        return [step] * (steps - 1), (steps - 1) * base

    monkeypatch.setattr(loop_bench, "run_leg", fake_leg)
    setup = loop_bench.Setup("fake", None, None, None, {"backend": "x"})
    rows = loop_bench.bench_row(setup, legs=6, timed=3)
    assert order == [0, 1, 1, 0, 0, 1]
    sync, lag = rows
    assert (sync["max_staleness"], lag["max_staleness"]) == (0, 1)
    assert sync["legs"] == lag["legs"] == 3 and sync["steps_timed"] == lag["steps_timed"] == 9
    assert sync["step_s"] == 1.04 and lag["step_s"] == 2.03          # legs 1,4,5 and 2,3,6: the middle leg
    assert sync["gen_train_ratio"] == 4.0 and sync["backend"] == "x"
    assert sync["wall_per_step_s"] == 1.04 and lag["wall_per_step_s"] == 2.03


@pytest.mark.slow
def test_quick_run_rows_and_provenance(tmp_path):
    out = tmp_path / "loop.json"
    proc = subprocess.run([sys.executable, "-m", "memr1.bench.loop", "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    keys = {"model", "max_staleness", "legs", "steps_timed", "step_s", "step_s_spread", "gen_s", "train_s",
            "sync_s", "sync_wait_s", "idle_s", "gen_train_ratio", "backend", "prompts_per_step", "group_size"}
    assert [r["max_staleness"] for r in data["rows"]] == [0, 1]
    for r in data["rows"]:
        assert keys <= set(r), keys - set(r)
        assert r["model"] == "tiny-random" and r["legs"] == 2 and r["steps_timed"] == 2
        lo, hi = r["step_s_spread"]
        assert 0 < lo <= r["step_s"] <= hi and r["gen_s"] > 0 and r["train_s"] > 0
    assert data["rows"][0]["idle_s"] > 0  # synchronous: the learner waits for every rollout
    for r in data["rows"]:  # each leg's window holds its timed step's rollout: no mode is timed on training alone
        assert r["wall_per_step_s"] >= r["gen_s"], r
    assert data["settings"]["order"] == [0, 1, 1, 0]
    (h,) = data["headline"]
    sync, lag = data["rows"]
    assert h["value"] == pytest.approx(sync["wall_per_step_s"] / lag["wall_per_step_s"]) and h["value"] > 0
    assert (h["ours"], h["baseline"]) == ("max_staleness 1 tiny-random", "max_staleness 0 tiny-random")
    m = data["machine"]
    assert m["commit"] and m["time"] and m["argv"] and m["torch"]
