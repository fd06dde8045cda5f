"""`memr1 eval` end to end: a subprocess on the smoke config (2 synthetic conversations, the default
SmolLM2 model through vLLM), checking the report file's structure and counts."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_memr1_eval_smoke(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "memr1.engine.cli", "eval", "--config", str(ROOT / "configs" / "eval_smoke.toml"),
           "--split", "train", f"run_dir={run_dir}", f"cache_dir={tmp_path / 'cache'}"]
    env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = run_dir / "eval" / "train.json"
    assert f"wrote {out}" in proc.stdout
    assert "single-hop" in proc.stdout and "overall" in proc.stdout   # the table was printed
    report = json.loads(out.read_text())
    assert report["split"] == "train" and report["baseline"] == "memr1" and report["n_conversations"] == 2
    assert report["n_questions"] == 4   # eval.max_questions = 2 per conversation
    assert report["model"].startswith("SmolLM2-135M-Instruct@")
    metrics = report["metrics"]
    assert set(metrics) == {"single-hop", "multi-hop", "open-domain", "temporal", "overall"}
    assert metrics["overall"]["n"] == 4 == sum(metrics[c]["n"] for c in metrics if c != "overall")
    assert 0.0 <= metrics["overall"]["f1"] <= 100.0 and metrics["overall"]["j"] is None   # judge off
    assert report["latency"]["answer"]["n"] == 4 and report["latency"]["search"]["n"] == 4
    assert report["manager"]["turns_per_call"] == 3
    assert report["oracle"] is not None and 0.0 <= report["oracle"]["op_accuracy"] <= 1.0
    assert len(report["answers"]) == 4 and all(isinstance(a["prediction"], str) for a in report["answers"])
    # each conversation's extraction, bank and progress are cached for a resume
    assert len(list((tmp_path / "cache" / "facts").glob("*/synth-0-000[01]-*/facts.json"))) == 2
    assert len(list((tmp_path / "cache" / "banks").glob("*/synth-0-000[01]-*/bank/MANIFEST.json"))) == 2
    assert report["models"]["extract"] == report["models"]["answer"] and report["weight_swaps"] == 0
    assert (run_dir / "eval" / "train.config.toml").is_file()
    assert set(report["capped"]) == {"extract", "manager", "answer"} and report["capped"]["answer"]["calls"] == 4


def test_eval_cli_reports_bad_input_without_loading_a_model(tmp_path, capsys):
    from argparse import Namespace

    from memr1.engine.evaluate import eval_cli

    smoke = str(ROOT / "configs" / "eval_smoke.toml")
    assert eval_cli(Namespace(config=smoke, checkpoint=None, split="val", overrides=["eval.bogus=1"])) == 2
    assert "unknown key 'eval.bogus'" in capsys.readouterr().err
    # the 2 smoke conversations are both in the train split: val is empty, and says so
    assert eval_cli(Namespace(config=smoke, checkpoint=None, split="val", overrides=[])) == 2
    assert "no conversations in split 'val'" in capsys.readouterr().err
    missing = str(tmp_path / "nope.json")
    assert eval_cli(Namespace(config=smoke, checkpoint=None, split="val", overrides=[f"data.path={missing}"])) == 2
    assert "no such file" in capsys.readouterr().err
    assert eval_cli(Namespace(config=smoke, checkpoint=str(tmp_path), split="train", overrides=[])) == 2
    assert "no config.json (HF checkpoint) or config.toml (run directory)" in capsys.readouterr().err
