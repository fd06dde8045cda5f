"""bench.attention: the dense-mask baseline's mask is the rows layout's attention pattern, and a --quick
run writes both impls per group size, agreeing before timing, with the JSON's provenance and a headline
taken from its rows."""
import json
import subprocess
import sys

import pytest
import torch

from memr1.bench.attention import dense_mask, headline
from memr1.engine.training.batching import Seq, build_micro


def test_dense_mask_is_causal_prompt_plus_own_response():
    prompt = torch.tensor([5, 6, 7])
    unit = [Seq(0, prompt, torch.tensor([1, 2]), None), Seq(1, prompt, torch.tensor([3]), None)]
    micro = build_micro([unit], False, 8, torch.device("cpu"))
    m = dense_mask(micro, 3, [2, 1])[0, 0]
    assert m.shape == (8, 8)
    assert m[4].tolist() == [True, True, True, True, True, False, False, False]   # response 0, token 1
    assert m[5].tolist() == [True, True, True, False, False, True, False, False]  # response 1 skips response 0
    assert m[6].tolist() == [True] * 3 + [False] * 3 + [True, False]             # padding: prompt and itself


def test_headline_is_dense_over_prefix_per_group_size():
    rows = [{"impl": "dense_mask", "group_size": 4, "step_s": 2.0},
            {"impl": "memr1_prefix", "group_size": 4, "step_s": 1.0},
            {"impl": "dense_mask", "group_size": 8, "step_s": 3.0}]
    g4, g8 = headline(rows)
    assert g4["value"] == 2.0 and (g4["ours"], g4["baseline"]) == ("memr1_prefix G=4", "dense_mask G=4")
    assert g4["unit"] == "x" and g4["better"] == "higher" and g4["target"] is None
    assert g8["value"] is None and g8["met"] is None  # memr1_prefix did not run at G=8


@pytest.mark.slow
def test_quick_run_rows_and_provenance(tmp_path):
    out = tmp_path / "attention.json"
    proc = subprocess.run([sys.executable, "-m", "memr1.bench.attention", "--quick", "--rounds", "2",
                           "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert [(r["impl"], r["group_size"]) for r in data["rows"]] == [
        ("dense_mask", 4), ("memr1_prefix", 4), ("dense_mask", 8), ("memr1_prefix", 8)]
    for r in data["rows"]:
        assert r["hidden_rel_diff"] < 1e-4 and r["grad_rel_diff"] < 1e-4
        lo, hi = r["step_s_spread"]
        assert 0 < lo <= r["step_s"] <= hi and r["build_ms"] > 0 and r["rounds"] == 2
        assert r["positions"] <= r["row_width"]
    assert data["rows"][0]["speedup_vs_dense"] == 1.0
    labels = {f"{r['impl']} G={r['group_size']}": r for r in data["rows"]}
    assert [h["name"] for h in data["headline"]] == [f"G={g}: dense_mask over memr1_prefix, step_s" for g in (4, 8)]
    for h in data["headline"]:
        ours, base = labels[h["ours"]], labels[h["baseline"]]
        assert h["value"] == pytest.approx(base["step_s"] / ours["step_s"]) == ours["speedup_vs_dense"]
    m = data["machine"]
    assert m["commit"] and m["time"] and m["argv"] and m["torch"]
