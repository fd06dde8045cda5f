"""bench/gpu_check.sh --dry: every part of the GPU check (imports without the native bank, a learner step
with MFU and a profiler trace, HF generation and update_weights, the kernel bench) on the CPU at toy
sizes, and every file the script promises written, small enough to come back from the device, and
readable (the JSON results, the gzipped Chrome trace); the learner's headline is taken from its rows."""
import gzip
import json
import math
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from memr1.bench.gpu_learner import headline

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
DRY_FILES = {"gpu_check.log", "summary.json", "learner.json", "learner_trace.json.gz", "rollout_hf.json",
             "kernels_cpu.json"}


def run_script(out: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OUT=str(out), PY=sys.executable)
    env.pop("GPU_CHECK_DRY", None)
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    proc = run_script(out, "--dry")
    assert proc.returncode == 0, f"gpu_check.sh --dry failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    return out, proc


def load(out: Path, name: str):
    return json.loads((out / name).read_text())


@pytest.mark.slow
def test_every_part_passes(dry):
    out, proc = dry
    summary = load(out, "summary.json")
    assert summary["ok"] and summary["dry"] and summary["device"] == "cpu"
    parts = {p["part"]: p for p in summary["parts"]}
    assert {"imports", "learner", "rollout", "bench_kernels"} <= set(parts)
    assert all(p["rc"] == 0 and not p["skipped"] and not p["timed_out"] for p in parts.values()), parts
    log = (out / "gpu_check.log").read_text()
    assert all(f"== {name}: exit 0" in log for name in parts)
    assert "memr1 from ['" in log and "/py/memr1" in log  # the checkout through the symlinked package
    assert proc.stdout.strip().splitlines()[-1].startswith("gpu_check: exit 0")


@pytest.mark.slow
def test_every_promised_file_is_written_and_readable(dry):
    out, _ = dry
    summary = load(out, "summary.json")
    assert DRY_FILES <= set(summary["promised"])
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8, files  # what comes back from the device: at most 8 files, 16 MiB each
    for name in summary["promised"]:
        path = out / name
        assert path.is_file() and 0 < path.stat().st_size < 16 << 20, name
        if name.endswith(".json"):
            assert isinstance(json.loads(path.read_text()), dict), name
        elif name.endswith(".json.gz"):
            with gzip.open(path, "rt") as f:
                assert isinstance(json.load(f), dict), name
        elif name.endswith(".xml"):
            ET.parse(path)
    for name in ("learner.json", "rollout_hf.json", "kernels_cpu.json"):
        assert load(out, name)["rows"] and "machine" in load(out, name), name


@pytest.mark.slow
def test_learner_step_mfu_and_trace(dry):
    out, _ = dry
    result = load(out, "learner.json")
    assert result["bench"] == "gpu_learner" and result["dry"]
    assert "6 * (non_embedding_params + lm_head_params) * positions" in result["formula"]
    (row,) = result["rows"]
    assert row["variant"] == "default" and row["device"] == "cpu" and row["activation_checkpointing"]
    assert row["positions"] == 2 * (32 + 4 * 16) and row["response_tokens"] == 2 * 4 * 16
    assert row["vocab"] == 49152 and row["layers"] == 2  # SmolLM2's tokenizer on the tiny shape
    assert row["flops_params"] == row["non_embedding_params"] + row["lm_head_params"]
    assert row["model_flops"] == 6 * row["flops_params"] * row["positions"]
    assert row["steps"] == len(row["step_ms_all"]) == 2 and row["step_ms_median"] > 0
    step_s = row["step_ms_median"] / 1e3
    assert math.isclose(row["mfu"], row["model_flops"] / (step_s * row["peak_flops"]), rel_tol=1e-9)
    assert row["peak_flops"] == 989e12 and row["hfu_with_recompute"] > row["mfu"] > 0
    assert math.isclose(row["positions_per_s"], row["positions"] / step_s, rel_tol=1e-9)
    assert math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"])
    head = {h["name"]: h for h in result["headline"]}
    assert set(head) == {"default: MFU", "default: response tokens/s"}
    assert all(h["ours"] == row["variant"] for h in head.values())
    assert head["default: MFU"]["value"] == row["mfu"] and head["default: MFU"]["unit"] == "share"
    assert head["default: response tokens/s"]["value"] == row["response_tokens_per_s"] > 0
    profile = result["profile"]
    top = profile["top_ops"]["cpu_time_total"]
    assert 0 < len(top) <= 15 and all(t["op"] and t["count"] > 0 for t in top)
    with gzip.open(out / profile["trace"], "rt") as f:
        trace = json.load(f)
    ops = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"]
    assert any(e["name"] == "aten::mm" for e in ops) and any("AdamW" in e["name"] for e in trace["traceEvents"])


def test_learner_headline_per_variant():
    rows = [{"variant": "default", "device": "cuda:0", "gpu": "H200", "mfu": 0.25, "peak_flops": 989e12,
             "response_tokens_per_s": 5000.0},
            {"variant": "no_ac", "device": "cuda:0", "mfu": None}]
    mfu, tokens, no_ac_mfu, no_ac_tokens = headline(rows)
    assert (mfu["name"], mfu["value"], mfu["unit"], mfu["ours"]) == ("default: MFU", 0.25, "share", "default")
    assert mfu["device"] == "H200" and mfu["peak_flops"] == 989e12
    assert (tokens["value"], tokens["unit"], tokens["baseline"]) == (5000.0, "tokens/s", "none")
    assert no_ac_mfu["value"] is None and no_ac_tokens["value"] is None and no_ac_tokens["device"] == "cuda:0"


@pytest.mark.slow
def test_hf_generation_and_update(dry):
    out, _ = dry
    result = load(out, "rollout_hf.json")
    assert result["dtype"] == "bfloat16" and result["hf_device"] == "cpu"
    (gen,) = [r for r in result["rows"] if "prompt_kind" in r]
    assert (gen["engine"], gen["variant"], gen["prompt_kind"]) == ("hf", "hf_dynamic", "short")
    assert gen["new_tokens"] == 4 and gen["tokens_per_s"] > 0 and gen["prefill_s"] > 0
    (update,) = [r for r in result["rows"] if "update_ms" in r]
    assert update["update_ms"] > 0 and update["copy_ms"] > 0


def test_unknown_argument_is_refused(tmp_path):
    proc = run_script(tmp_path, "--bogus")
    assert proc.returncode == 2 and "usage" in proc.stderr
