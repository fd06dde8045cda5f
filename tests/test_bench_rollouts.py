"""bench.rollouts: a --quick run on the tiny model runs the real command at two group sizes and writes
rows whose phase shares make up the timed wall time."""
import json
import subprocess
import sys

import pytest


def test_quick_run_rows_add_up(tiny_model, tmp_path):
    out = tmp_path / "rollouts.json"
    proc = subprocess.run([sys.executable, "-m", "memr1.bench.rollouts", "--quick", "--model", str(tiny_model),
                           "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["bench"] == "rollouts" and data["settings"]["order"] == [2, 4]
    for row, g in zip(data["rows"], (2, 4)):
        assert row["group_size"] == g and row["completions"] == 2 * g   # 2 items, one step of 2 prompts
        shares = [row[f"{s}_share"] for s in ("generate", "frozen", "bank", "reward", "write", "other")]
        assert all(s >= 0 for s in shares) and sum(shares) == pytest.approx(1.0)
        assert row["outside_generation"] == pytest.approx(1 - shares[0] - shares[1])
        assert row["rollouts_per_s"] == pytest.approx(row["completions"] / row["wall_s"])
    (h,) = data["headline"]
    assert h["value"] == data["rows"][1]["bank_reward_share"] and h["met"] == (h["value"] <= 0.10)
