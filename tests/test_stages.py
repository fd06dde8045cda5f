"""Both Memory-R1 stages through the real loop, generator and learner, on a tiny random model; rank
slices that gather back into the single-process batch."""
import json
import zlib

import msgspec
import pytest

from memr1.engine.dist import merge_rollouts
from memr1.engine.generation import Completion, GeneratorConfig, SamplingConfig, make_generator
from memr1.engine.learner import Learner, LearnerConfig
from memr1.engine.loop import Loop, LoopConfig
from memr1.engine.stages import AnswerStage, ManagerStage, StageConfig
from memr1.memory_store import HashEmbedder
from memr1.rl.agents.answer import AnswerConfig
from memr1.rl.agents.manager import ManagerConfig
from memr1.rl.data import load_conversations
from memr1.rl.items import ItemsConfig, build_items
from tiny_model import tiny_llama

FAST = StageConfig(prompts_per_step=2, group_size=2, frozen_sampling=SamplingConfig(temperature=0.0, max_new_tokens=6))
SAMPLING = SamplingConfig(max_new_tokens=12, seed=0)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tiny_llama(tmp_path_factory.mktemp("tiny"))
    gen_cfg = GeneratorConfig(backend="hf", model=str(folder), max_model_len=2048)
    embedder = HashEmbedder(64)
    manager_items, answer_items = build_items(load_conversations(None, n=3, seed=0, split="train"), embedder,
                                              ItemsConfig())
    return folder, gen_cfg, embedder, manager_items, answer_items


def make_loop(setup, stage_name, k, steps=2):
    folder, gen_cfg, embedder, manager_items, answer_items = setup
    policy = make_generator(gen_cfg)
    learner = Learner(LearnerConfig(model_path=str(folder), lr=1e-4))
    if stage_name == "manager":
        stage = ManagerStage(manager_items, make_generator(gen_cfg), embedder, FAST, SAMPLING, ManagerConfig(top_k=5),
                             AnswerConfig(top_k_per_speaker=5))
    else:
        stage = AnswerStage(answer_items, embedder, FAST, SAMPLING, AnswerConfig(top_k_per_speaker=5))
    metrics = []
    return Loop(stage, policy, learner, LoopConfig(steps=steps, max_staleness=k), metrics.append), metrics, policy


@pytest.mark.parametrize("stage_name", ["manager", "answer"])
@pytest.mark.parametrize("k", [0, 1])
def test_one_step_end_to_end(setup, stage_name, k):
    loop, metrics, policy = make_loop(setup, stage_name, k)
    out = loop.run()
    assert out["steps_done"] == 2 and policy.weight_version == 2
    assert [m["weight_version"] for m in metrics] == [1, 2]
    assert all(m["staleness"] <= k for m in metrics)
    for m in metrics:
        for key in ("reward_mean", "loss", "gen_s", "train_s", "sync_s", "parse_failure_rate"):
            assert isinstance(m[key], float), key
    if stage_name == "manager":
        assert metrics[0]["parse_failure_rate"] == 1.0  # a random model writes no JSON: penalised, not crashed
        assert metrics[0]["reward_mean"] <= 0


class ScriptedGenerator:
    """Returns fixed manager outputs, one per completion of the group."""
    weight_version = 0

    def __init__(self, texts):
        self.texts = texts

    def generate(self, prompts, n, sampling):
        return [[Completion(prompt_index=i, token_ids=[5, 6], logprobs=[-1.0, -1.0], text=self.texts[j % len(self.texts)],
                            finish_reason="stop", weight_version=0, prompt_token_ids=[1, 2, 3]) for j in range(n)]
                for i in range(len(prompts))]


def test_forks_keep_rollouts_independent(setup):
    _, _, embedder, manager_items, _ = setup
    item = manager_items[0]
    before = [(m.id, m.text) for m in item.bank]
    texts = [json.dumps({"memory": [{"id": "99", "text": f"new fact {g}", "event": "ADD"}]}) for g in range(3)]
    texts.append("not json at all")
    frozen = ScriptedGenerator(["Answer: nothing"])
    stage = ManagerStage([item], frozen, embedder, msgspec.structs.replace(FAST, prompts_per_step=1, group_size=4),
                         SAMPLING, ManagerConfig(top_k=5), AnswerConfig(top_k_per_speaker=5))
    captured = []
    original = stage.frozen.generate

    def spy(prompts, n, sampling):
        captured.extend(p[-1]["content"] for p in prompts)
        return original(prompts, n, sampling)
    stage.frozen.generate = spy
    rollout = stage.rollout(0, ScriptedGenerator(texts))
    per_fork = len(item.questions)
    for g in range(3):  # each fork saw only its own ADD
        prompt_text = " ".join(captured[g * per_fork:(g + 1) * per_fork])
        assert f"new fact {g}" in prompt_text
        assert all(f"new fact {o}" not in prompt_text for o in range(3) if o != g)
    assert [(m.id, m.text) for m in item.bank] == before  # the base bank is unchanged
    assert rollout.metrics["parse_failure_rate"] == 0.25
    assert rollout.batch.rewards[3] == -1.0  # the unparseable completion: EM 0 minus the format penalty


class EchoGenerator:
    """Deterministic: each prompt's token ids are a digest of the prompt, so batches show which prompts
    they hold; completion j of a group answers with the j-th text."""
    weight_version = 0

    def __init__(self, texts):
        self.texts = texts

    def generate(self, prompts, n, sampling):
        def digest(p):
            return [zlib.crc32(json.dumps(p).encode()) % 40000 + 1, 7]
        return [[Completion(prompt_index=i, token_ids=[5 + j, 6], logprobs=[-1.0, -1.0],
                            text=self.texts[j % len(self.texts)], finish_reason="stop", weight_version=0,
                            prompt_token_ids=digest(p)) for j in range(n)] for i, p in enumerate(prompts)]


@pytest.mark.parametrize("stage_name", ["manager", "answer"])
def test_rank_slices_gather_into_the_single_process_batch(setup, stage_name):
    _, _, embedder, manager_items, answer_items = setup
    cfg = msgspec.structs.replace(FAST, prompts_per_step=4)
    texts = ['{"memory": [{"id": "0", "text": "new fact", "event": "ADD"}]}', "Answer: nothing", "x"]

    def make(rank, world):
        if stage_name == "manager":
            return ManagerStage(manager_items, EchoGenerator(["Answer: nothing"]), embedder, cfg, SAMPLING,
                                ManagerConfig(top_k=5), AnswerConfig(top_k_per_speaker=5), rank, world)
        return AnswerStage(answer_items, embedder, cfg, SAMPLING, AnswerConfig(top_k_per_speaker=5), rank, world)

    for step in (0, 1):
        single = make(0, 1).rollout(step, EchoGenerator(texts))
        merged = merge_rollouts([make(r, 2).rollout(step, EchoGenerator(texts)) for r in range(2)])
        a, b = merged.batch, single.batch
        assert [t.tolist() for t in a.input_ids] == [t.tolist() for t in b.input_ids]  # same prompts, same order
        assert a.rewards.tolist() == b.rewards.tolist()
        assert a.group_ids.tolist() == b.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
        for key in ("reward_mean", "parse_failure_rate", "response_tokens"):
            assert merged.metrics[key] == pytest.approx(single.metrics[key]), key


def test_prompts_per_step_must_divide_over_the_ranks(setup):
    _, _, embedder, _, answer_items = setup
    with pytest.raises(ValueError, match="prompts_per_step=2 does not divide over 3 data-parallel ranks"):
        AnswerStage(answer_items, embedder, FAST, SAMPLING, AnswerConfig(), rank=0, world=3)
