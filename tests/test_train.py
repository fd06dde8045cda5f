"""`memr1 train` end to end on a tiny random model: run directory, both stages, resume, dry run."""
import json
from pathlib import Path

import pytest

from memr1.engine.config import load_config
from memr1.engine.plan import plan_text
from memr1.engine.checkpoint import latest_checkpoint
from memr1.engine.train import train
from tiny_model import tiny_llama


def overrides(model, run_dir, steps):
    return [f"generator.model={model}", "generator.backend=hf", "generator.max_model_len=2048",
            "embedder=hash", "data.n=3", f"run_dir={run_dir}", f"loop.steps={steps}",
            "stage.prompts_per_step=2", "stage.group_size=2", "sampling.max_new_tokens=8",
            "stage.frozen_sampling.max_new_tokens=4", "learner.lr=1e-4", "eval.manager_max_new_tokens=8"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("tiny"))


def test_both_stages_write_the_run_directory_and_resume(model, tmp_path):
    cfg = load_config(None, overrides(model, tmp_path / "run", 2))
    out = train(cfg)
    run = tmp_path / "run"
    assert (run / "config.toml").is_file() and any((run / "tb").rglob("events.*"))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["stage"], r["step"]) for r in rows] == [("manager", 1), ("manager", 2), ("answer", 1), ("answer", 2)]
    for key in ("reward_mean", "loss", "kl", "gen_s", "train_s", "sync_s", "tokens_per_s", "weight_version",
                "staleness"):
        assert all(key in r for r in rows), key
    assert set(out["checkpoints"]) == {"manager", "answer"}
    assert (latest_checkpoint(run / "manager") / "model.safetensors").is_file()

    # Resume with more steps: each stage continues from its checkpoint, no step is redone.
    more = load_config(run / "config.toml", ["loop.steps=3"])
    train(more)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["stage"], r["step"]) for r in rows][4:] == [("manager", 3), ("answer", 3)]


def test_stage2_banks_from_the_trained_manager_then_eval_base_and_trained(model, tmp_path):
    run = tmp_path / "run"
    cfg = load_config(None, overrides(model, run, 1) + [
        'eval_after=["base", "trained"]', "eval_split=train", f"eval.cache_dir={tmp_path / 'cache'}",
        "eval.max_turns=6", "eval.max_questions=1", "eval.extract_max_new_tokens=8",
        "eval.manager_max_new_tokens=8", "eval.answer_max_new_tokens=4", "eval.judge=off", "eval.progress=false"])
    out = train(cfg)
    # Stage 2 trained on banks built by stage 1's final checkpoint, cached in the run.
    assert list((run / "answer" / "banks").glob("*/*/bank/MANIFEST.json"))
    base, trained = (json.loads(Path(out["evals"][w]).read_text()) for w in ("base", "trained"))
    assert Path(out["evals"]["base"]).name == "train.base.json" and base["baseline"] == "base"
    assert Path(out["evals"]["trained"]).name == "train.json"   # the run's own eval/<split>.json
    assert trained["baseline"] == "memr1"
    assert "manager/checkpoints/step_1" in trained["models"]["manager"]
    assert "answer/checkpoints/step_1" in trained["models"]["answer"]
    assert set(base["models"].values()) == {trained["models"]["extract"]} == {trained["models"]["judge"]}
    # The trained eval reuses the base eval's extraction: both extract with the base model.
    assert trained["facts_cache"] == base["facts_cache"] and trained["bank_cache"] != base["bank_cache"]
    assert base["n_questions"] == trained["n_questions"] > 0
    # One engine served every role: at least the answer agent's checkpoint was swapped in (the tiny
    # model's extraction finds no facts, so the manager may never be called).
    assert trained["weight_swaps"] >= 1


def test_dry_run_catches_what_cannot_fit(model, tmp_path):
    text, fits = plan_text(load_config(None, overrides(model, tmp_path, 1)))
    assert fits and "per step: 4 rollouts" in text and "GiB" in text
    text, fits = plan_text(load_config(None, overrides(model, tmp_path, 1) + ["learner.device=cuda"]))
    assert not fits and "no CUDA device" in text
    text, fits = plan_text(load_config(None, overrides(model, tmp_path, 1) + ["generator.max_model_len=200000000"]))
    assert not fits and "DOES NOT FIT" in text


@pytest.mark.parametrize("name", ["default", "locomo_grpo", "locomo_ppo"])
def test_shipped_configs_load(name):
    cfg = load_config(f"configs/{name}.toml")
    assert cfg.name == name and cfg.stages == ["manager", "answer"]
    if name.startswith("locomo"):
        assert cfg.learner.lr == 1e-6 and cfg.sampling.temperature == 1.0 and cfg.learner.algo == name[7:]
