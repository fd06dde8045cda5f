"""`memr1 train --resume` end to end on the tiny model (oracle banks, one conversation: seconds a run):
SIGTERM in each stage, kill -9 mid-stage and a damaged latest checkpoint each resume to the exact step
sequence in metrics.jsonl (and in TensorBoard); a changed config is refused with a diff."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from memr1.engine import stage_driver, train as train_mod
from memr1.engine.cli import main as cli_main
from memr1.engine.config.run import load_config
from run_helpers import overrides, rows




def config(model, run, steps=3, every=0):
    return overrides(model, run, steps) + ["items.bank_pipeline=oracle", "items.answer_banks=oracle", "data.n=1",
                                           f"loop.checkpoint_every={every}"]


def sequence(run: Path) -> list[str]:
    return [f"{r['stage'][0]}{r['step']}" for r in rows(run)]


def tb_steps(run: Path, stage: str) -> list[int]:
    """The steps TensorBoard shows (events past a purge step hidden, as TensorBoard does)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run / "tb" / stage), purge_orphaned_data=True)
    acc.Reload()
    return [e.step for e in acc.Scalars(f"{stage}/reward_mean")]


@pytest.fixture
def sigterm_at(monkeypatch):
    """sigterm_at(stage, step): the run gets a SIGTERM right after logging that step."""
    target = {}

    class Stopping(stage_driver.RunLog):
        def __call__(self, m):
            super().__call__(m)
            if (m["stage"], m["step"]) == target.get("at"):
                os.kill(os.getpid(), signal.SIGTERM)
    monkeypatch.setattr(stage_driver, "RunLog", Stopping)
    return lambda stage=None, step=None: target.update(at=(stage, step))


@pytest.mark.slow
def test_sigterm_in_each_stage_then_resume_logs_every_step_once(tiny_model, tmp_path, sigterm_at, capsys):
    run = tmp_path / "run"
    sigterm_at("manager", 2)
    out = train_mod.train(load_config(None, config(tiny_model, run)))
    assert out["stopped"] == "manager" and out["stop_signal"] == signal.SIGTERM and sequence(run) == ["m1", "m2"]
    capsys.readouterr()

    # A changed config is refused with one line per changed key, unless the key is allowed.
    assert cli_main(["train", "--resume", str(run), "stage.manager.group_size=4", "seed=3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --resume ") and "in 2 key(s); pass --allow-config-change seed,stage.manager.group_size" in err
    assert "\n  seed: 0 -> 3\n  stage.manager.group_size: 2 -> 4\n" in err
    assert cli_main(["train", "--resume", str(run), "--config", str(run / "config.toml")]) == 2
    assert "drop --config" in capsys.readouterr().err
    assert cli_main(["train", "--resume", str(run), "--allow-config-change", "learner", "learner.algo=ppo"]) == 2
    assert "learner.algo (the checkpoints hold" in capsys.readouterr().err
    assert cli_main(["train", "--resume", str(run), "--allow-config-change", "nosuch.key"]) == 2
    assert "no config key 'nosuch.key'" in capsys.readouterr().err
    assert sequence(run) == ["m1", "m2"]              # nothing ran

    sigterm_at("answer", 1)
    assert cli_main(["train", "--resume", str(run)]) == 128 + signal.SIGTERM   # 143, as a shell reports it
    assert sequence(run) == ["m1", "m2", "m3", "a1"]
    sigterm_at()
    assert cli_main(["train", "--resume", str(run), "--allow-config-change", "stage.answer.steps",
                     "stage.answer.steps=4"]) == 0
    assert sequence(run) == ["m1", "m2", "m3", "a1", "a2", "a3", "a4"]
    assert tb_steps(run, "manager") == [1, 2, 3] and tb_steps(run, "answer") == [1, 2, 3, 4]


KILLER = """
import json, os, signal, sys
from memr1.engine import stage_driver as d, train as t
from memr1.engine.config.run import load_config

class Killed(d.RunLog):
    def __call__(self, m):
        super().__call__(m)
        if (m["stage"], m["step"]) == ("manager", 3):
            self.tb.flush()      # TensorBoard has the step too, as it would after its periodic flush
            os.kill(os.getpid(), signal.SIGKILL)

d.RunLog = Killed
t.train(load_config(None, json.loads(sys.argv[1])))
"""


@pytest.mark.slow
def test_kill_9_mid_stage_resumes_from_the_checkpoint_and_logs_each_step_once(tiny_model, tmp_path, capsys):
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", KILLER, json.dumps(config(tiny_model, run, steps=4, every=2))],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert sequence(run) == ["m1", "m2", "m3"] and tb_steps(run, "manager") == [1, 2, 3]
    assert sorted(p.name for p in (run / "manager" / "checkpoints").iterdir()) == ["step_2"]
    capsys.readouterr()
    assert cli_main(["train", "--resume", str(run)]) == 0
    assert "dropped 1 line(s)" in capsys.readouterr().out
    assert sequence(run) == ["m1", "m2", "m3", "m4", "a1", "a2", "a3", "a4"]
    assert tb_steps(run, "manager") == [1, 2, 3, 4]
    # checkpoint.keep_last = 2 (the default): older checkpoints are pruned
    assert sorted(p.name for p in (run / "answer" / "checkpoints").iterdir()) == ["step_2", "step_4"]


@pytest.mark.slow
def test_a_damaged_latest_checkpoint_falls_back_and_nothing_good_is_one_line(tiny_model, tmp_path, sigterm_at, capsys):
    run = tmp_path / "run"
    sigterm_at("manager", 2)
    train_mod.train(load_config(None, config(tiny_model, run, every=1)))
    latest = run / "manager" / "checkpoints" / "step_2"
    weights = latest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])          # truncated
    sigterm_at()
    capsys.readouterr()
    assert cli_main(["train", "--resume", str(run)]) == 0
    out = capsys.readouterr().out
    assert "falling back to" in out and "step_1" in out and "model.safetensors has 1000 bytes" in out
    assert sequence(run) == ["m1", "m2", "m3", "a1", "a2", "a3"]
    assert sorted(p.name for p in (run / "manager" / "checkpoints").iterdir()) == ["step_2", "step_3"]
    assert (run / "manager" / "checkpoints" / "step_2" / "model.safetensors").stat().st_size > 1000   # saved anew

    for ckpt in (run / "answer" / "checkpoints").iterdir():
        (ckpt / "state.json").write_text("")
    capsys.readouterr()
    assert cli_main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "no usable checkpoint" in err


def test_user_errors_in_train_are_one_line(tiny_model, tmp_path, capsys):
    from data_rows import lme_item
    assert cli_main(["train", "--config", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: config file {tmp_path} is a directory, not a TOML file\n"
    lme = tmp_path / "lme.json"
    lme.write_text(json.dumps([lme_item()]))
    (tmp_path / "c.toml").write_text("")
    assert cli_main(["train", "--config", str(tmp_path / "c.toml")] + config(tiny_model, tmp_path / "run")
                    + [f"data.path={lme}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nothing to train on: it is a LongMemEval file, an evaluation set" in err
    a_file = tmp_path / "not_a_folder"
    a_file.write_text("keep me")
    assert cli_main(["train", "--config", str(tmp_path / "c.toml")] + config(tiny_model, a_file)) == 2
    assert capsys.readouterr().err == f"error: run_dir {a_file} exists and is not a folder\n"
    assert cli_main(["eval", "--config", str(tmp_path / "c.toml"), "--split", "val"] + config(tiny_model, a_file)) == 2
    assert capsys.readouterr().err == f"error: run_dir {a_file} exists and is not a folder\n"
    assert a_file.read_text() == "keep me"
