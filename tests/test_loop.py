"""The actor-learner loop with fakes: staleness bound by capacity, overlap, failures, signals."""
import os
import signal
import threading
import time

import pytest

from memr1.engine.loop import Loop, LoopConfig, Rollout, RolloutError


class FakeGenerator:
    def __init__(self):
        self.weight_version = 0
        self.updates = []

    def update_weights(self, named, version, manifest=None):
        assert manifest == {"w": (1,)} and [n for n, _ in named] == ["w"]
        self.updates.append(version)
        self.weight_version = version


class FakeStage:
    name = "fake"

    def __init__(self, gen_s=0.02, fail_at=()):
        self.gen_s, self.fail_at, self.log = gen_s, set(fail_at), []

    def rollout(self, step, generator):
        self.log.append(("start", step, generator.weight_version, time.perf_counter()))
        time.sleep(self.gen_s)
        if step in self.fail_at:
            raise ValueError(f"model emitted garbage at step {step}")
        self.log.append(("end", step, generator.weight_version, time.perf_counter()))
        return Rollout(batch={"step": step}, metrics={"reward_mean": 0.5})


class FakeLearner:
    def __init__(self, train_s=0.02):
        self.train_s, self.seen = train_s, []

    def train_step(self, batch):
        self.seen.append(batch["step"])
        time.sleep(self.train_s)
        return {"loss": 1.0}

    def export_weights(self, bucket_bytes):
        yield [("w", None)]

    def weight_manifest(self):
        return {"w": (1,)}


def run(k, steps=8, gen_s=0.02, train_s=0.02, **kw):
    gen, stage, learner, metrics, ckpts = FakeGenerator(), FakeStage(gen_s, kw.pop("fail_at", ())), FakeLearner(train_s), [], []
    loop = Loop(stage, gen, learner, LoopConfig(steps=steps, max_staleness=k, **kw), metrics.append, ckpts.append)
    return loop.run(), gen, stage, learner, metrics, ckpts


@pytest.mark.parametrize("k", [0, 1, 2])
def test_no_rollout_beyond_the_staleness_bound(k):
    # A slow learner and a fast producer: capacity, not filtering, keeps the producer within k.
    out, gen, stage, learner, metrics, ckpts = run(k, steps=10, gen_s=0.001, train_s=0.03)
    assert learner.seen == list(range(10)) and out["too_stale"] == 0
    starts = [(step, version) for kind, step, version, _ in stage.log if kind == "start"]
    assert len(starts) == 10, "each step generated exactly once, nothing thrown away"
    assert all(step - version <= k for step, version in starts)
    assert max(m["staleness"] for m in metrics) == k  # the bound is reached, so it is what limits
    assert gen.updates == list(range(1, 11)) and ckpts == [10]


def test_synchronous_mode_never_overlaps():
    _, gen, stage, *_ = run(0, steps=5)
    starts = [(s, v) for kind, s, v, _ in stage.log if kind == "start"]
    assert starts == [(s, s) for s in range(5)]  # every rollout on the newest weights


def test_staleness_one_overlaps_generation_and_training():
    out, _, stage, _, metrics, _ = run(1, steps=6, gen_s=0.05, train_s=0.05)
    # The producer starts step s+1 before the learner finishes step s.
    starts = {s: t for kind, s, _, t in stage.log if kind == "start"}
    assert any(m["staleness"] == 1 for m in metrics)
    assert starts[1] < starts[0] + 0.05 + 0.05


def test_sync_every_needs_enough_staleness():
    with pytest.raises(ValueError, match="max_staleness >= 1"):
        Loop(FakeStage(), FakeGenerator(), FakeLearner(), LoopConfig(sync_every=2, max_staleness=0))
    out, gen, *_ = run(1, steps=6, sync_every=2)
    assert gen.updates == [2, 4, 6]


def test_a_failing_producer_stops_the_run_with_context():
    with pytest.raises(RolloutError, match="step 3 failed with ValueError: model emitted garbage") as err:
        run(1, steps=8, fail_at={3})
    assert "producer traceback" in str(err.value)


def test_skip_mode_counts_failures_and_goes_on():
    out, gen, _, learner, metrics, _ = run(0, steps=6, fail_at={2, 4}, on_rollout_error="skip")
    assert learner.seen == [0, 1, 3, 5] and out["skipped"] == 2
    assert out["weight_version"] == 4 and gen.updates == [1, 2, 3, 4]
    assert sum(1 for m in metrics if m.get("skipped")) == 2
    with pytest.raises(RolloutError, match="max_skipped=1"):
        run(0, steps=6, fail_at={1, 2, 3}, on_rollout_error="skip", max_skipped=1)


def test_sigterm_checkpoints_and_stops():
    threading.Timer(0.15, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
    out, _, _, learner, _, ckpts = run(1, steps=1000, gen_s=0.01, train_s=0.02)
    assert 0 < out["steps_done"] < 1000 and ckpts == [out["steps_done"]]
    assert learner.seen == list(range(out["steps_done"]))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
