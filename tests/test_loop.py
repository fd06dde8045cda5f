"""The actor-learner loop with fakes: staleness bound by capacity, overlap, failures, signals, and
data-parallel agreement (stop, skip, fail together) through the agree hook and scalar all-reduces."""
import os
import signal
import threading
import time

import pytest

import torch

from memr1.engine.config.run import LoopConfig
from memr1.engine.loop import Loop, RolloutError
from memr1.engine.training.dist import agree_rollouts
from memr1.rl.records import Group, Rollout, TrainBatch
from loop_fakes import FakeGenerator, FakeLearner, FakeStage


def run(k, steps=8, gen_s=0.02, train_s=0.02, **kw):
    gen, stage, learner, metrics, ckpts = FakeGenerator(), FakeStage(gen_s, kw.pop("fail_at", ())), FakeLearner(train_s), [], []
    kw.setdefault("checkpoint_every", 0)   # checkpoints only where these tests expect them
    loop = Loop(stage, gen, learner, LoopConfig(max_staleness=k, **kw), steps, metrics.append, ckpts.append)
    return loop.run(), gen, stage, learner, metrics, ckpts


@pytest.mark.parametrize("k", [0, 1, 2])
def test_no_rollout_beyond_the_staleness_bound(k):
    # A slow learner and a fast producer: capacity, not filtering, keeps the producer within k.
    out, gen, stage, learner, metrics, ckpts = run(k, steps=10, gen_s=0.001, train_s=0.03)
    assert learner.seen == list(range(10))
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


class GeneratingStage:
    """A rollout as the Memory-R1 stages run it: one policy generate call, then scoring that does not
    touch the policy engine (the frozen answer agent, bank forks)."""
    name = "generating"

    def __init__(self, gen_s, score_s):
        self.gen_s, self.score_s, self.sampled = gen_s, score_s, {}

    def rollout(self, step, generator):
        generator.generate()
        self.sampled[step] = generator.weight_version
        time.sleep(self.score_s)
        return Rollout(batch={"step": step}, metrics={})


class BusyGenerator(FakeGenerator):
    def __init__(self, gen_s):
        super().__init__()
        self.gen_s, self.busy = gen_s, False

    def generate(self):
        self.busy = True
        time.sleep(self.gen_s)
        self.busy = False

    def update_weights(self, named, version, manifest=None):
        assert not self.busy, "weights loaded during a generate call"
        super().update_weights(named, version, manifest)


def test_a_weight_sync_waits_for_the_generate_call_not_the_whole_rollout():
    gen, stage, metrics = BusyGenerator(gen_s=0.02), GeneratingStage(gen_s=0.02, score_s=0.3), []
    Loop(stage, gen, FakeLearner(train_s=0.01), LoopConfig(max_staleness=1, checkpoint_every=0), 5,
         metrics.append).run()
    # Rollout s+1 is scoring when step s's sync comes; holding the lock for the whole rollout waited ~0.3 s.
    assert max(m["sync_wait_s"] for m in metrics) < 0.15, [m["sync_wait_s"] for m in metrics]
    # Staleness counts from the weights the generate call used, and stays within the bound.
    for i, m in enumerate(metrics):
        assert m["staleness"] == i - stage.sampled[i] <= 1
    assert any(m["staleness"] == 1 for m in metrics)


def test_sync_every_needs_enough_staleness():
    with pytest.raises(ValueError, match="max_staleness >= 1"):
        Loop(FakeStage(), FakeGenerator(), FakeLearner(), LoopConfig(sync_every=2, max_staleness=0), 4)
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


def test_validation_runs_every_n_steps_on_synced_weights():
    gen, stage, learner, metrics = FakeGenerator(), FakeStage(), FakeLearner(), []
    seen = []

    def validate(step):
        seen.append((step, gen.weight_version))
        return {"val_em_mean": step / 10}
    Loop(stage, gen, learner, LoopConfig(max_staleness=1, sync_every=2, validate_every=3), 7, metrics.append,
         validate=validate).run()
    assert seen == [(3, 3), (6, 6), (7, 7)]   # every 3 steps and at the end, weights synced even off-cycle
    assert [m.get("val_em_mean") for m in metrics] == [None, None, 0.3, None, None, 0.6, 0.7]


def test_sigterm_checkpoints_and_stops():
    threading.Timer(0.15, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
    out, _, _, learner, _, ckpts = run(1, steps=1000, gen_s=0.01, train_s=0.02)
    assert 0 < out["steps_done"] < 1000 and ckpts == [out["steps_done"]]
    assert learner.seen == list(range(out["steps_done"]))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


# ---- data parallel: two loops in threads, agreeing through an in-process stand-in for all_reduce ----
class ThreadGroup:
    def __init__(self, world):
        self.slots, self.barrier = [None] * world, threading.Barrier(world, timeout=10)  # a deadlock fails

    def agree(self, rank):
        def reduce(t, op):
            self.slots[rank] = t.clone()
            self.barrier.wait()
            stacked = torch.stack(self.slots)
            out = stacked.sum(0) if op == "sum" else stacked.max(0).values
            self.barrier.wait()  # nobody overwrites a slot before everyone has read them all
            return t.copy_(out)
        return lambda item, step: agree_rollouts(item, step, rank, len(self.slots), reduce)


class RankStage(FakeStage):
    def __init__(self, rank, **kw):
        super().__init__(**kw)
        self.rank = rank

    def rollout(self, step, generator):
        super().rollout(step, generator)
        group = Group(prompt_ids=[self.rank, step], responses=[[1]], behav_logprobs=None, rewards=[1.0])
        return Rollout(TrainBatch([group]), metrics={"reward_mean": float(self.rank), "response_tokens": 3})


class RankLearner(FakeLearner):
    def __init__(self, on_train=lambda n: None):
        super().__init__(train_s=0.005)
        self.on_train = on_train

    def train_step(self, batch):
        self.seen.append([tuple(g.prompt_ids) for g in batch.groups])
        self.on_train(len(self.seen))
        return {"loss": 1.0}


def run_ranks(world=2, steps=6, k=0, fail_at=None, stop_at=None, **kw):
    """Run one Loop per rank in threads; fail_at = {rank: steps}, stop_at = (rank, after n trained steps)."""
    group, results, loops = ThreadGroup(world), [None] * world, []
    for r in range(world):
        learner, metrics, ckpts = RankLearner(), [], []
        loop = Loop(RankStage(r, gen_s=0.005, fail_at=(fail_at or {}).get(r, ())), FakeGenerator(), learner,
                    LoopConfig(max_staleness=k, **kw), steps, metrics.append, ckpts.append, agree=group.agree(r))
        loop.metrics, loop.ckpts = metrics, ckpts
        if stop_at and stop_at[0] == r:  # a SIGTERM on this rank only
            learner.on_train = lambda n, loop=loop: n == stop_at[1] and setattr(loop, "stop_requested", True)
        loops.append(loop)

    def go(r):
        try:
            results[r] = loops[r].run()
        except Exception as e:  # noqa: BLE001  (compared below)
            results[r] = e
    threads = [threading.Thread(target=go, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results, loops


def test_each_rank_trains_its_own_groups_and_logs_the_reduced_metrics():
    results, loops = run_ranks(steps=3)
    for r, loop in enumerate(loops):
        assert loop.learner.seen == [[(r, s)] for s in range(3)]   # nothing crossed ranks but scalars
        assert [m["reward_mean"] for m in loop.metrics] == [0.5] * 3  # averaged over ranks
        assert [m["response_tokens"] for m in loop.metrics] == [6] * 3  # summed
        assert loop.ckpts == [3]


def test_a_stop_on_one_rank_stops_every_rank_at_the_same_step():
    results, loops = run_ranks(steps=50, k=1, stop_at=(1, 3))
    assert [r["steps_done"] for r in results] == [3, 3]
    assert [loop.ckpts for loop in loops] == [[3], [3]]  # the collective save: same step on all ranks


@pytest.mark.parametrize("k", [0, 1])
def test_a_failure_on_one_rank_is_skipped_by_every_rank(k):
    # Rank 0's producer must count rank 1's failure out of its capacity, or it waits forever at k=0.
    results, loops = run_ranks(steps=6, k=k, fail_at={1: {2}}, on_rollout_error="skip")
    assert [r["skipped"] for r in results] == [1, 1] and [r["weight_version"] for r in results] == [5, 5]
    for loop in loops:
        assert [s[0][1] for s in loop.learner.seen] == [0, 1, 3, 4, 5]
        skipped = [m for m in loop.metrics if m.get("skipped")]
        assert len(skipped) == 1 and "on rank 1" in skipped[0]["error"]


def test_a_failure_on_one_rank_stops_every_rank():
    results, _ = run_ranks(steps=6, fail_at={1: {2}})
    assert all(isinstance(r, RolloutError) and "step 2 failed on rank 1" in str(r) for r in results)
    # The failing rank raises with its own message and traceback; the others point at it.
    assert "ValueError: model emitted garbage at step 2" in str(results[1]) and "producer traceback" in str(results[1])
    assert "a rollout failed on rank 1 (its output has the traceback)" in str(results[0])


class SleepyGenerator(FakeGenerator):
    """Records the order of sleep / wake / update calls, and refuses to generate while asleep."""

    def __init__(self):
        super().__init__()
        self.events, self.asleep = [], False

    def sleep(self):
        self.events.append("sleep")
        self.asleep = True

    def wake(self):
        self.events.append("wake")
        self.asleep = False

    def update_weights(self, named, version, manifest=None):
        assert not self.asleep, "weights must land in an awake engine"
        self.events.append("update")
        super().update_weights(named, version, manifest)


class GuardedStage(FakeStage):
    def rollout(self, step, generator):
        assert not generator.asleep, "rollout on a sleeping generator"
        return super().rollout(step, generator)


def test_sleep_while_training_brackets_each_learner_step():
    gen, stage, learner, metrics = SleepyGenerator(), GuardedStage(), FakeLearner(), []
    Loop(stage, gen, learner, LoopConfig(sleep_while_training=True), 3, metrics.append).run()
    assert gen.events == ["sleep", "wake", "update"] * 3
    assert all("sleep_s" in m for m in metrics) and learner.seen == [0, 1, 2]
    with pytest.raises(ValueError, match="sleep_while_training needs loop.max_staleness = 0"):
        Loop(stage, gen, learner, LoopConfig(max_staleness=1, sleep_while_training=True), 3)
