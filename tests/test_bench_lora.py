"""bench.lora: a quick run's rows and headline, and the properties its docstring states (LoRA trains
only its adapters; into the HF generator, which holds them, a push after the first moves their bytes alone,
and a merged push the full model's)."""
import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_quick_run_rows_and_headline(tmp_path):
    out = tmp_path / "lora.json"
    proc = subprocess.run([sys.executable, "-m", "memr1.bench.lora", "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = {r["impl"]: r for r in data["rows"]}
    full, lora = rows["full"], rows["lora"]
    # full trains every weight; LoRA adds its adapters to the same base and trains them alone
    assert full["trainable_params"] == full["total_params"] == lora["total_params"] - lora["trainable_params"]
    assert 0 < lora["trainable_params"] < full["total_params"] / 10
    assert lora["adapter_bytes"] == 4 * lora["trainable_params"] and full["adapter_bytes"] is None
    # the HF generator holds the adapters: after the first push, A and B alone; merged, every weight
    assert lora["push_bytes"] == lora["adapter_bytes"] and lora["merged_push_bytes"] == full["push_bytes"]
    for r in rows.values():
        assert r["peak_rss_mb"] > 0 and r["step_ms"] > 0 and r["push_ms"] > 0 and r["decode_tok_s"] > 0
    assert lora["merged_push_ms"] > 0 and lora["merged_decode_tok_s"] > 0
    head = {h["name"]: h for h in data["headline"]}
    push = head["weight push bytes: full over LoRA adapter-only (rank 16)"]
    assert push["value"] == pytest.approx(full["push_bytes"] / lora["adapter_bytes"]) and push["target"] == 5.0
    assert push["merged_ratio"] == pytest.approx(1.0)
    assert head["learner peak memory: full over LoRA"]["value"] == pytest.approx(
        full["peak_rss_mb"] / lora["peak_rss_mb"])
    assert head["decode with the adapters active over merged weights"]["value"] == pytest.approx(
        lora["decode_tok_s"] / lora["merged_decode_tok_s"])
