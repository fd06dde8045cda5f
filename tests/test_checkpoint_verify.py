"""Checkpoint manifests: every kind of damage is found at load, resume falls back to the previous good
checkpoint (saying so) or stops with one line, pruning keeps what a resume and best.json need, the
configured lr wins on resume, and a rollout error still leaves a checkpoint."""
import json
import os

import pytest

from learner_helpers import make_batch
from loop_fakes import FakeGenerator, FakeLearner, FakeStage
from memr1.engine.checkpoints import files as cm
from memr1.engine.checkpoints import io as checkpoint
from memr1.engine.config.run import LoopConfig
from memr1.engine.loop import Loop, RolloutError
from memr1.engine.training.config import LearnerConfig
from memr1.engine.training.learner import Learner


def learner(path, lr=1e-3):
    return Learner(LearnerConfig(warmup_steps=4), path, lr=lr)


@pytest.fixture(scope="module")
def saved(tiny, tmp_path_factory):
    """A stage folder with checkpoints step_1 and step_2 (copied per test)."""
    stage = tmp_path_factory.mktemp("stage")
    lrn = learner(tiny)
    for step in (1, 2):
        lrn.train_step(make_batch(seed=step))
        checkpoint.save(lrn, str(stage), step, {"step": step})
    return stage


@pytest.fixture
def stage(saved, tmp_path):
    import shutil
    return shutil.copytree(saved, tmp_path / "stage")


def truncate(f):
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def flip(f):
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))


DAMAGE = {
    "missing optimizer.pt": lambda d: (d / "optimizer.pt").unlink(),
    "missing state.json": lambda d: (d / "state.json").unlink(),
    "missing weights": lambda d: (d / "model.safetensors").unlink(),
    "truncated safetensors": lambda d: truncate(d / "model.safetensors"),
    "empty state.json": lambda d: (d / "state.json").write_text(""),
    "missing RNG file": lambda d: (d / "rng_rank0.pt").unlink(),
    "a flipped byte": lambda d: flip(d / "optimizer.pt"),
    "a garbled manifest": lambda d: (d / "manifest.json").write_text("{not json"),
    "a manifest that is a list": lambda d: (d / "manifest.json").write_text("[]"),
    "a manifest that is a string": lambda d: (d / "manifest.json").write_text('"memr1-checkpoint"'),
    "a manifest 100,000 deep": lambda d: (d / "manifest.json").write_text("[" * 100_000 + "]" * 100_000),
    "a manifest of non-UTF-8 bytes": lambda d: (d / "manifest.json").write_bytes(b"\xff\xfe{"),
    "a manifest entry that is no object": lambda d: edit_manifest(d, lambda m: m["files"].update({"state.json": 7})),
    "a manifest naming a file outside": lambda d: edit_manifest(d, lambda m: m["files"].update(
        {"../step_1/state.json": listing(d / "../step_1/state.json")})),
    "a state.json 100,000 deep": lambda d: (d / "state.json").write_text("[" * 100_000 + "]" * 100_000),
}


def listing(f) -> dict:
    """A manifest's entry for file f, right in size and checksum."""
    import hashlib
    return {"bytes": f.stat().st_size, "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}


def edit_manifest(d, change):
    manifest = json.loads((d / "manifest.json").read_text())
    change(manifest)
    (d / "manifest.json").write_text(json.dumps(manifest))


def test_a_whole_checkpoint_verifies_and_lists_every_file(stage):
    path = stage / "checkpoints" / "step_2"
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["step"] == 2 and set(manifest["files"]) == set(os.listdir(path)) - {"manifest.json"}
    assert cm.verify(path) is None and cm.usable_checkpoint(stage, say=print) == path


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damage_is_found_and_resume_falls_back_saying_so(stage, damage, tiny):
    latest = stage / "checkpoints" / "step_2"
    DAMAGE[damage](latest)
    problem = cm.verify(latest)
    assert problem, damage
    said = []
    assert cm.usable_checkpoint(stage, say=said.append) == stage / "checkpoints" / "step_1"
    assert len(said) == 1 and "falling back to" in said[0] and "step_2" in said[0]
    assert checkpoint.load(learner(tiny), str(stage / "checkpoints" / "step_1"))["step"] == 1


def test_a_checkpoint_from_before_manifests_is_checked_for_its_files(stage):
    path = stage / "checkpoints" / "step_2"
    (path / "manifest.json").unlink()
    assert cm.verify(path) is None
    (path / "optimizer.pt").unlink()
    assert cm.verify(path) == "missing or empty: optimizer.pt"


def test_nothing_good_left_is_one_line(stage):
    DAMAGE["missing weights"](stage / "checkpoints" / "step_2")
    DAMAGE["empty state.json"](stage / "checkpoints" / "step_1")
    with pytest.raises(cm.CheckpointError) as e:
        cm.usable_checkpoint(stage, say=print)
    msg = str(e.value)
    assert "\n" not in msg and "no usable checkpoint" in msg and "step_2: " in msg and "step_1: " in msg
    assert cm.usable_checkpoint(stage / "nothing", say=print) is None   # no checkpoints: a fresh start


def test_a_missing_rng_file_is_refused_at_load_too(stage, tiny):
    path = stage / "checkpoints" / "step_2"
    (path / "rng_rank0.pt").unlink()   # load itself (past verification) does not accept it silently
    with pytest.raises(cm.CheckpointError, match="no rng_rank0.pt"):
        checkpoint.load(learner(tiny), str(path))


def test_pruning_keeps_the_newest_best_json_and_a_good_one(tiny, tmp_path):
    lrn = learner(tiny)
    for step in range(1, 6):
        checkpoint.save(lrn, str(tmp_path), step)
    (tmp_path / "best.json").write_text(json.dumps({"step": 2, "score": 1.0}))
    names = lambda: sorted(p.name for p in cm.checkpoints(tmp_path))   # noqa: E731
    assert [p.name for p in cm.prune(tmp_path, 2)] == ["step_3", "step_1"]
    assert names() == ["step_2", "step_4", "step_5"]
    DAMAGE["missing weights"](tmp_path / "checkpoints" / "step_5")
    DAMAGE["missing weights"](tmp_path / "checkpoints" / "step_4")
    (tmp_path / "best.json").unlink()
    assert cm.prune(tmp_path, 2) == [] and names() == ["step_2", "step_4", "step_5"]   # step_2: the only good one
    # after a resume fell back to step_2 and saved it again, the damaged later ones go
    assert [p.name for p in cm.prune(tmp_path, 2, current=2)] == ["step_5", "step_4"] and names() == ["step_2"]


def test_the_configured_lr_wins_on_resume(stage, tiny):
    path = str(stage / "checkpoints" / "step_2")
    same, changed = learner(tiny), learner(tiny, lr=5e-4)
    checkpoint.load(same, path)
    checkpoint.load(changed, path)
    # warmup 4: step 2's rate is 3/4 of the base, for either base
    assert same.optim.param_groups[0]["lr"] == pytest.approx(1e-3 * 3 / 4)
    assert changed.optim.param_groups[0]["lr"] == pytest.approx(5e-4 * 3 / 4)
    changed.train_step(make_batch(seed=3))
    assert changed.optim.param_groups[0]["lr"] == pytest.approx(5e-4)


def test_a_rollout_error_still_checkpoints_what_trained():
    ckpts = []
    loop = Loop(FakeStage(fail_at={3}), FakeGenerator(), FakeLearner(), LoopConfig(checkpoint_every=0), 8,
                save_checkpoint=ckpts.append)
    with pytest.raises(RolloutError):
        loop.run()
    assert ckpts == [3]          # steps 1..3 trained; the failed 4th runs again on resume
    ckpts.clear()
    loop = Loop(FakeStage(fail_at={2}), FakeGenerator(), FakeLearner(), LoopConfig(checkpoint_every=2), 8,
                save_checkpoint=ckpts.append)
    with pytest.raises(RolloutError):
        loop.run()
    assert ckpts == [2]          # already checkpointed at 2: not written twice


@pytest.mark.parametrize("name", ["manifest.json", "state.json"])
def test_a_fifo_in_a_checkpoint_is_refused_not_waited_on(tmp_path, name):
    import threading
    if name == "state.json":
        (tmp_path / "manifest.json").unlink(missing_ok=True)
    os.mkfifo(tmp_path / name)
    out = []
    t = threading.Thread(target=lambda: out.append(cm.verify(tmp_path)), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), f"verify() blocked on a FIFO {name}"
    assert out[0] and ("does not read" in out[0] or "missing" in out[0])
