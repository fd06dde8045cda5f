"""`memr1 train` with a manager_episode stage on a tiny random model: the curriculum's phases, each
starting from the previous phase's best-validation checkpoint (each phase's start scored too), and the
promotion gate."""
import json

import pytest

from memr1.engine.config.run import load_config
from memr1.engine.train import train
from run_helpers import overrides, rows

EPISODE = ["stage.manager_episode.prompts_per_step=1", "stage.manager_episode.group_size=2",
           "stage.manager_episode.lr=1e-4", "episode.inner_n=2", "episode.reroll_prob=1.0",
           "episode.local_questions=2", "episode.global_questions=4", "rollout.top_k=1", "data.n=10"]


@pytest.mark.slow
def test_a_curriculum_hands_each_phase_its_predecessors_best_checkpoint(tiny_model, tmp_path, capsys):
    run = tmp_path / "run"
    cfg = load_config(None, overrides(tiny_model, run, 1, ["manager_episode"]) + EPISODE + [
        "episode.curriculum=[[1, 2, 0.0], [2, 1, 0.2]]", "loop.validate_every=1", "loop.validate_start=true",
        "loop.max_staleness=0"])
    out = train(cfg)
    assert out["stopped"] is None
    every = [r for r in rows(run) if r["stage"] == "manager_episode"]
    starts = [r for r in every if r.get("phase_start")]
    assert [r["step"] for r in starts] == [0, 2]                 # the warm start, then phase 1's start
    assert all("val_reward_mean" in r and "val_evidence_miss" in r and "loss" not in r for r in starts)
    got = [r for r in every if not r.get("phase_start")]
    assert [r["step"] for r in got] == [1, 2, 3]
    assert [r["sessions"] for r in got] == [1, 1, 2]            # the window grows with the phase
    for r in got:
        for key in ("reward_mean", "reward_em", "reward_compression", "zero_var_global", "zero_var_local",
                    "groups_local", "val_reward_mean", "forks", "final_memories", "loss"):
            assert key in r, key
    assert all(r["reward_compression"] == 0.0 for r in got[:2])  # phase 1's lam is 0
    best = json.loads((run / "manager_episode" / "best.json").read_text())
    assert best["phase"] == 1 and best["step"] in (2, 3)         # phase 2's start or its step: not phase 1's scores
    printed = capsys.readouterr().out
    assert "phase 1 starts from step" in printed


@pytest.mark.slow
def test_a_phase_whose_best_checkpoint_misses_the_gate_stops_the_stage(tiny_model, tmp_path, capsys):
    run = tmp_path / "run"
    cfg = load_config(None, overrides(tiny_model, run, 1, ["manager_episode"]) + EPISODE + [
        "episode.curriculum=[[1, 1, 0.0], [2, 1, 0.0]]", "loop.validate_every=1", "episode.max_evidence_miss=0.0"])
    out = train(cfg)
    assert out["stopped"] == "manager_episode"
    assert [r["step"] for r in rows(run) if r["stage"] == "manager_episode"] == [1]
    assert "not started" in capsys.readouterr().out
