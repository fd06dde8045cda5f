"""Profiling: one tiny CPU manager step through the real loop, stage, generator and learner, traced
with every named range; unprofiled steps make no profiler; overlapping windows share a trace; the
config section."""
import json
import time

import pytest
import torch

from memr1.engine.config.errors import ConfigError
from memr1.engine.config.run import LoopConfig, load_config
from memr1.engine.generation import make_generator
from memr1.engine.generation.config import GeneratorConfig
from memr1.engine.loop import Loop
from memr1.engine.observe.profiling import StepProfiler
from memr1.engine.observe.traces import summarize_trace
from memr1.engine.training.config import LearnerConfig
from memr1.engine.training.learner import Learner
from memr1.memory_store import HashEmbedder
from memr1.rl import spans
from memr1.rl.task.agents.answer import AnswerConfig
from memr1.rl.task.agents.manager import ManagerConfig
from memr1.rl.task.facts import oracle_facts
from memr1.rl.task.data import load_conversations
from memr1.rl.generation import SamplingConfig
from memr1.rl.task.train_items import ItemsConfig, manager_calls, manager_items, oracle_bank
from memr1.rl.records import Rollout
from memr1.rl.task.stages.calls import ManagerStage, StageConfig
from memr1.rl.task.turns import Task
from memr1.rl.task.stages.context import StageContext

MANAGER = ManagerConfig(top_k=5, turns_per_call=2, max_new_tokens=8)


def test_one_tiny_cpu_step_traces_every_named_range(tmp_path, tiny_model):
    folder = tiny_model
    embedder = HashEmbedder(64)
    convs = load_conversations(None, n=3, split="train")
    specs = manager_calls(convs, {c.sample_id: oracle_facts(c) for c in convs}, MANAGER.turns_per_call)
    items = manager_items(specs, [oracle_bank(s, s.conv, embedder) for s in specs], ItemsConfig(), seed=0)
    gen_cfg = GeneratorConfig(backend="hf", model=str(folder), max_model_len=2048)
    ctx = StageContext(embedder, Task(manager=MANAGER, answer=AnswerConfig(max_new_tokens=4)),
                       sampling=SamplingConfig(max_new_tokens=8))
    stage = ManagerStage(items, make_generator(gen_cfg), ctx, StageConfig(prompts_per_step=2, group_size=2))
    learner = Learner(LearnerConfig(), str(folder), lr=1e-4)
    prof = StepProfiler([1], tmp_path / "profile" / "manager")
    metrics = []
    Loop(stage, make_generator(gen_cfg), learner, LoopConfig(), 1, metrics.append, profiler=prof).run()
    trace = tmp_path / "profile" / "manager" / "step_1.json"
    assert prof.written == [trace] and prof.active is None
    assert "traceEvents" in json.loads(trace.read_text())   # Chrome-trace JSON
    s = summarize_trace(trace)
    found = {r["name"]: r for r in s["ranges"]}
    assert set(spans.RANGES) <= set(found), f"missing ranges: {set(spans.RANGES) - set(found)}"
    assert all(found[n]["count"] >= 1 and found[n]["cpu_ms"] > 0 for n in spans.RANGES)
    assert any(op["name"].startswith("aten::") for op in s["top_ops"])
    m = metrics[0]
    assert m["profiled"] is True and m["sync_bytes"] > 0 and "peak_flops" not in m   # no peak on a CPU
    assert learner.flops_params > 0 and m["model_flops"] == 6 * learner.flops_params * m["positions"]
    assert m["completions"] == 4 and m["forks"] == 4 and m["frozen_tokens"] > 0


class Gen:
    weight_version = 0

    def update_weights(self, named, version, manifest=None):
        list(named)
        self.weight_version = version


class Stage:
    name = "fake"

    def rollout(self, step, generator):
        with spans.span("generate"):
            torch.ones(8) @ torch.ones(8)
        return Rollout(batch=None, metrics={})


class Train:
    def train_step(self, batch):
        time.sleep(0.05)   # long enough that the next rollout starts inside this step (max_staleness 1)
        return {}

    def export_weights(self):
        yield "w", torch.zeros(4)

    def weight_manifest(self):
        return {"w": (4,)}


def test_unprofiled_steps_make_no_profiler_and_overlapping_windows_share_a_trace(tmp_path, monkeypatch):
    import torch.profiler as tp
    made = []
    real = tp.profile
    monkeypatch.setattr(tp, "profile", lambda *a, **k: made.append(1) or real(*a, **k))
    assert spans.span("generate") is spans._OFF   # no profiler running: a no-op, no record_function

    prof = StepProfiler([3], tmp_path / "a")
    made.clear()   # its warm-up profile
    metrics = []
    Loop(Stage(), Gen(), Train(), LoopConfig(), 4, metrics.append, profiler=prof).run()
    assert len(made) == 1 and [p.name for p in prof.written] == ["step_3.json"]
    assert [m.get("profiled", False) for m in metrics] == [False, False, True, False]
    assert metrics[0]["sync_bytes"] == 16
    names = {r["name"] for r in summarize_trace(prof.written[0])["ranges"]}
    assert {"rollout", "generate", "train_step", "weight_sync"} <= names

    prof = StepProfiler([1, 2], tmp_path / "b")   # rollout 2 starts while step 1 trains
    made.clear()
    Loop(Stage(), Gen(), Train(), LoopConfig(max_staleness=1), 3, profiler=prof).run()
    assert [p.name for p in prof.written] == ["step_1-2.json"] and len(made) == 1


def test_the_profile_section_of_the_config():
    assert load_config(None, ["profile.steps=[2, 3]"]).profile.steps == [2, 3]
    assert load_config(None).profile.steps == []
    with pytest.raises(ConfigError, match="profile.steps"):
        load_config(None, ["profile.steps=[0]"])
    from memr1.engine.cli import build_parser
    assert build_parser().parse_args(["train", "--config", "c.toml", "--profile"]).profile
