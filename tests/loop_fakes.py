"""Stand-ins for the loop's generator, stage and learner: sleeps of a set length and a log of what ran."""
import time

from memr1.rl.records import Rollout


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

    def export_weights(self):
        yield "w", None

    def weight_manifest(self):
        return {"w": (1,)}
