"""bench.train_step: the step-1 agreement check, and a --quick run on a tiny model (every trainer in its
worker, the row keys the issue asks for, the positions each trainer computes, the JSON's provenance),
and the headline's tokens/s ratios."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from memr1.bench.train_step import check_agreement, headline


def test_check_agreement_passes_within_tolerance_and_stops_beyond():
    ref = {"loss": -0.5, "grad_norm": 2.0}
    ok = check_agreement({"trl": ref, "memr1": {"loss": -0.50001, "grad_norm": 2.0001}}, 1e-4)
    assert ok["memr1"]["loss_rel_diff"] == pytest.approx(2e-5) and ok["memr1"]["grad_norm_rel_diff"] == pytest.approx(5e-5)
    with pytest.raises(AssertionError, match="memr1_noshare"):
        check_agreement({"trl": ref, "memr1_noshare": {"loss": -0.5, "grad_norm": 2.001}}, 1e-4)
    with pytest.raises(AssertionError):
        check_agreement({"trl": ref, "memr1": {"loss": float("nan"), "grad_norm": 2.0}}, 1e-4)


def test_headline_pairs_tokens_per_s_and_leaves_a_missing_trainer_none():
    rows = [{"trainer": "memr1_noshare", "group_size": 4, "tokens_per_s": 200.0, "head_positions": 512},
            {"trainer": "trl_compact", "group_size": 4, "tokens_per_s": 100.0, "head_positions": 512},
            {"trainer": "memr1", "group_size": 4, "tokens_per_s": 300.0, "head_positions": 512}]
    noshare, shared = headline(rows)
    assert noshare["name"] == "G=4: memr1_noshare over trl_compact, tokens/s" and noshare["value"] == 2.0
    assert (noshare["ours"], noshare["baseline"]) == ("memr1_noshare G=4", "trl_compact G=4")
    assert noshare["target"] == 1.0 and noshare["met"] is True
    assert noshare["ours_head_positions"] == noshare["baseline_head_positions"] == 512
    assert shared["target"] == 1.5 and shared["value"] is None and shared["met"] is None  # trl did not run
    assert shared["ours_head_positions"] == 512 and "baseline_head_positions" not in shared


@pytest.mark.slow
def test_quick_run_rows_agreement_and_provenance(tiny_model, tmp_path):
    # find_spec, not importorskip: importing trl sets VLLM_LOGGING_LEVEL=ERROR in this process's
    # environment, which would leak into every later test's subprocesses.
    if importlib.util.find_spec("trl") is None:
        pytest.skip("trl is not installed (the Makefile installs it)")
    out = tmp_path / "train_step.json"
    scratch = tmp_path / "tmp"  # the run's temporary folder: whatever it leaves there it leaked
    scratch.mkdir()
    proc = subprocess.run([sys.executable, "-m", "memr1.bench.train_step", "--quick", "--model", str(tiny_model),
                           "--group-sizes", "4", "--steps", "5", "--json", str(out)],
                          capture_output=True, text=True, timeout=900, env={**os.environ, "TMPDIR": str(scratch)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(scratch)) == []
    data = json.loads(out.read_text())
    rows = {r["trainer"]: r for r in data["rows"]}
    assert set(rows) == {"memr1", "memr1_noshare", "trl", "trl_compact"}
    keys = {"trainer", "group_size", "tokens_per_s", "positions", "step_s", "step_s_spread", "cpu_s",
            "peak_rss_mb", "rss_rise_mb"}
    for r in rows.values():
        assert keys <= set(r), keys - set(r)
        assert r["group_size"] == 4 and r["steps_timed"] == 5
        lo, hi = r["step_s_spread"]
        assert lo <= r["step_s"] <= hi
        assert 0 < r["rss_rise_mb"] <= r["peak_rss_mb"]
    # 16 sequences of 32 + 32 tokens: TRL and memr1 without sharing compute every prompt per sequence,
    # memr1 with sharing each of the 4 prompts once.
    assert rows["trl"]["positions"] == rows["memr1_noshare"]["positions"] == 16 * 64
    assert rows["memr1"]["positions"] == 4 * 32 + 16 * 32
    # The LM head: TRL on CPU scores every next-token position; compact and memr1 the 32 response ones.
    assert rows["trl"]["head_positions"] == 16 * 63
    assert rows["trl_compact"]["head_positions"] == rows["memr1_noshare"]["head_positions"] == 16 * 32
    assert rows["memr1"]["head_positions"] == 16 * 32
    for name in ("memr1", "memr1_noshare", "trl_compact"):
        a = data["agreement"]["4"][name]
        assert a["loss_rel_diff"] <= 1e-4 and a["grad_norm_rel_diff"] <= 1e-4
        assert abs(a["ref_loss"]) > 1e-2  # a loss that is not a near-cancelling sum
    head = {h["name"]: h for h in data["headline"]}
    assert set(head) == {"G=4: memr1_noshare over trl_compact, tokens/s", "G=4: memr1 over trl, tokens/s"}
    for h in head.values():
        ours, base = (rows[h[side].removesuffix(" G=4")] for side in ("ours", "baseline"))
        assert h["value"] == pytest.approx(ours["tokens_per_s"] / base["tokens_per_s"])
        assert h["ours_head_positions"] == ours["head_positions"]
        assert h["baseline_head_positions"] == base["head_positions"]
        assert h["met"] == (h["value"] >= h["target"])
    m = data["machine"]
    assert m["commit"] and m["time"] and m["argv"] and m["torch"] and m["trl"]
    assert data["settings"]["4"]["micro_batch_tokens"] == 8 * 64
