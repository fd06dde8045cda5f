"""Both Memory-R1 stages through the real loop, generator and learner on a tiny random model; the same
turn through the training path and the eval path; rank shares that make up the single-process batch."""
import json
import zlib

from collections import Counter

import msgspec
import pytest
import torch

from memr1.engine.config.run import LoopConfig
from memr1.engine.generation import make_generator
from memr1.engine.generation.config import GeneratorConfig
from memr1.engine.loop import Loop
from memr1.engine.training.config import LearnerConfig
from memr1.engine.training.learner import Learner
from memr1.memory_store import HashEmbedder
from memr1.rl.task.agents.answer import AnswerConfig
from memr1.rl.task.agents.manager import ManagerConfig
from memr1.rl.task.banks import run_manager
from memr1.rl.task.facts import oracle_facts
from memr1.rl.task.data import load_conversations
from memr1.rl.task.data.synthetic import call_ops
from memr1.rl.task.eval.evaluation import EvalConfig, evaluate
from memr1.rl.task.eval.scoring import oracle_scores
from scripted import ScriptedGenerator
from memr1.rl.generation import Completion, SamplingConfig
from memr1.rl.task.train_items import ItemsConfig, answer_items, manager_calls, manager_items, oracle_bank
from memr1.rl.task.rewards import RewardConfig
from memr1.rl.task.stages.calls import AnswerStage, ManagerStage, StageConfig
from memr1.rl.task.turns import Task, decide, manager_turns
from memr1.rl.task.stages.warm import manager_target
from memr1.rl.task.stages.context import StageContext

FAST = StageConfig(prompts_per_step=2, group_size=2)
SAMPLING = SamplingConfig(max_new_tokens=12)
MANAGER = ManagerConfig(top_k=5, turns_per_call=2, max_new_tokens=12)
ANSWER = AnswerConfig(top_k_per_speaker=5, max_new_tokens=6)
TASK = Task(manager=MANAGER, answer=ANSWER)
REWARD = RewardConfig()


def build(convs, embedder, manager=MANAGER):
    facts = {c.sample_id: oracle_facts(c) for c in convs}
    specs = manager_calls(convs, facts, manager.turns_per_call)
    m_items = manager_items(specs, [oracle_bank(s, s.conv, embedder) for s in specs], ItemsConfig(), seed=0)
    a_items = answer_items(convs, {c.sample_id: oracle_bank(None, c, embedder) for c in convs}, seed=0)
    return m_items, a_items


@pytest.fixture(scope="module")
def setup(tiny_model):
    torch.manual_seed(0)  # the module's unseeded samples do not depend on the tests that ran before it
    folder = tiny_model
    gen_cfg = GeneratorConfig(backend="hf", model=str(folder), max_model_len=2048)
    embedder = HashEmbedder(64)
    convs = load_conversations(None, n=3, split="train")
    return folder, gen_cfg, embedder, *build(convs, embedder), convs


def manager_stage(items, frozen, embedder, cfg=FAST, rank=0, world=1, reward=REWARD):
    return ManagerStage(items, frozen, StageContext(embedder, TASK, reward, SAMPLING, rank=rank, world=world), cfg)


@pytest.mark.parametrize("stage_name", ["manager", "answer"])
@pytest.mark.parametrize("k", [0, 1])
def test_one_step_end_to_end(setup, stage_name, k):
    folder, gen_cfg, embedder, manager_items_, answer_items_, _ = setup
    policy = make_generator(gen_cfg)
    learner = Learner(LearnerConfig(), str(folder), lr=1e-4)
    if stage_name == "manager":
        stage = manager_stage(manager_items_, make_generator(gen_cfg), embedder)
    else:
        stage = AnswerStage(answer_items_, StageContext(embedder, TASK, REWARD, SAMPLING), FAST)
    metrics = []
    out = Loop(stage, policy, learner, LoopConfig(max_staleness=k), 2, metrics.append).run()
    assert out["steps_done"] == 2 and policy.weight_version == 2
    assert [m["weight_version"] for m in metrics] == [1, 2]
    assert all(m["staleness"] <= k for m in metrics)
    for m in metrics:
        for key in ("reward_mean", "reward_em", "reward_format", "em_mean", "f1_mean", "loss", "gen_s", "train_s",
                    "sync_s", "parse_failure_rate", "capped_rate"):
            assert isinstance(m[key], float), key
        assert m["reward_mean"] == pytest.approx(sum(v for k, v in m.items() if k.startswith("reward_") and k != "reward_mean"))
    if stage_name == "manager":
        assert metrics[0]["parse_failure_rate"] == 1.0  # a random model writes no JSON: penalised, not crashed
        assert metrics[0]["reward_format"] == -1.0 and metrics[0]["frozen_answers"] > 0


def test_forks_keep_rollouts_independent(setup):
    _, _, embedder, manager_items_, _, _ = setup
    # an item whose speaker ends with at most top_k memories, so every answer prompt shows the fork's ADDs
    item = next(it for it in manager_items_ if sum(m.speaker == it.call["speaker"] for m in it.bank)
                + len(it.call["facts"]) + 1 <= ANSWER.top_k_per_speaker)
    before = [(m.id, m.text) for m in item.bank]
    extra = len(item.call["facts"])   # one ADD per fact is free: each fork writes one memory more
    texts = [json.dumps({"memory": [{"id": str(90 + k), "text": f"new fact {g}" if k == 0 else f"copy {k} of {g}",
                                     "event": "ADD"} for k in range(extra + 1)]}) for g in range(3)]
    texts.append("not json at all")
    frozen = ScriptedGenerator(["Answer: nothing"], finish="length")
    stage = manager_stage([item], frozen, embedder, msgspec.structs.replace(FAST, prompts_per_step=1, group_size=4),
                          reward=msgspec.structs.replace(REWARD, memory_penalty=0.25))
    policy = ScriptedGenerator(texts)
    rollout = stage.rollout(0, policy)
    per_fork = len(item.questions)
    for g in range(3):  # each fork saw only its own ADD
        prompt_text = " ".join(p[-1]["content"] for p in frozen.prompts[g * per_fork:(g + 1) * per_fork])
        assert f"new fact {g}" in prompt_text
        assert all(f"new fact {o}" not in prompt_text for o in range(3) if o != g)
    assert [(m.id, m.text) for m in item.bank] == before  # the base bank is unchanged
    assert rollout.metrics["parse_failure_rate"] == 0.25 and rollout.metrics["frozen_capped_rate"] == 1.0
    group = rollout.batch.groups[0]
    assert group.rewards[3] == -1.0 and group.breakdown["format"] == [0.0, 0.0, 0.0, -1.0]  # EM 0 - the penalty
    assert group.breakdown["memory"] == [-0.25, -0.25, -0.25, 0.0]   # one memory past the free zone per parsed fork
    # the group carries the prompt ids the policy reported for the item's prompt, once, and its 4 responses
    assert group.prompt_ids == [zlib.crc32(json.dumps(policy.prompts[0]).encode()) % 40000 + 1, 7]
    assert group.responses == [[5 + j, 6] for j in range(4)]


@pytest.mark.parametrize("turns_per_call, list_unchanged", [(1, True), (3, True), (2, False)])
def test_the_training_and_eval_paths_build_the_same_manager_turn(tmp_path, turns_per_call, list_unchanged):
    """Every manager call of evaluation's bank building has the exact prompt of the training item for
    that call, and the same completion applies the same ops: an eval manager that answers each prompt
    with the oracle ops computed on the training path rebuilds exactly the oracle's final banks."""
    embedder = HashEmbedder(64)
    convs = load_conversations(None, n=3, split="train")
    manager = msgspec.structs.replace(MANAGER, turns_per_call=turns_per_call, list_unchanged=list_unchanged)
    facts = {c.sample_id: oracle_facts(c) for c in convs}
    specs = manager_calls(convs, facts, turns_per_call, every_call=True)
    scripted = {}   # training path: the item's prompt -> the oracle's ops for it, and the events they apply
    for spec in specs:
        bank = oracle_bank(spec, spec.conv, embedder)
        turn = manager_turns([(bank, spec.call)],
                             embedder, manager)[0]
        target = manager_target(turn, [bank.get(i).text for i in turn.prompt.bank_ids], spec.call, spec.conv.oracle,
                                list_unchanged)
        events = decide([(turn, target)], embedder, manager)[0].events
        scripted[json.dumps(turn.prompt.messages)] = (target, events)

    class OracleManager:
        seen = []

        def generate(self, prompts, n, sampling):
            self.seen += [json.dumps(p) for p in prompts]
            return [[Completion(0, [1], [0.0], scripted[json.dumps(p)][0], "stop", 0, [1])] for p in prompts]

    gen = OracleManager()
    builds = run_manager(convs, {c.sample_id: tmp_path / c.sample_id for c in convs}, facts, gen, embedder, manager)
    assert sorted(gen.seen) == sorted(scripted)   # the same prompts, each once: no call differs
    for conv in convs:
        b = builds[conv.sample_id]
        assert sorted(m.text for m in b.bank) == sorted(conv.oracle["final_facts"].values())
        for step in b.steps:
            for call in step["groups"]:
                assert call["status"] == "ok"
        scores = oracle_scores(conv, b.steps, [m.text for m in b.bank], 0.5)   # the oracle's ops score 1.0
        assert scores["op_inter"] == scores["op_union"] > 0
        assert all(c["inter_ids"] == c["union_ids"] for c in scores["calls"])   # every op hit the oracle's memory
        b.bank.close()
    assert {"ADD", "UPDATE", "DELETE"} <= {e for _, events in scripted.values() for e in events}


def test_the_manager_warm_target_takes_the_calls_facts_in_order():
    """One item per net op of the call, in the order of its facts, each starting with the fact it is
    about (an UPDATE's new text is its fact in the synthetic data); the folded facts of a chain are the
    only ones without an item, and every UPDATE, DELETE and NONE names the shown memory it concerns."""
    embedder = HashEmbedder(64)
    convs = load_conversations(None, n=6, split="train")
    facts = {c.sample_id: oracle_facts(c) for c in convs}
    seen = Counter()
    for spec in manager_calls(convs, facts, 2, every_call=True):
        bank = oracle_bank(spec, spec.conv, embedder)
        turn = manager_turns([(bank, spec.call)], embedder, MANAGER)[0]
        shown = [bank.get(i).text for i in turn.prompt.bank_ids]
        items = json.loads(manager_target(turn, shown, spec.call, spec.conv.oracle, False))["memory"]
        texts = [it["text"] for it in items]
        rest = iter(spec.call["facts"])
        assert all(t in rest for t in texts), (texts, spec.call["facts"])   # a subsequence of the facts
        net = call_ops(spec.conv.oracle["timeline"], spec.call["dia_ids"])
        assert len(items) == len(net)
        for it, op in zip(items, net):
            seen[it["event"]] += 1
            if it["event"] != "ADD":
                assert shown[int(it["id"])] == it["old_memory"] == op["old_memory"]
    assert min(seen[e] for e in ("ADD", "UPDATE", "DELETE", "NONE")) > 0, seen


def test_the_training_and_eval_paths_build_the_same_answer_prompts(setup, tmp_path):
    _, _, embedder, _, answer_items_, convs = setup
    train_gen = ScriptedGenerator(["Answer: x"])
    AnswerStage(answer_items_, StageContext(embedder, TASK, REWARD, SAMPLING),
                StageConfig(prompts_per_step=len(answer_items_), group_size=1)).rollout(0, train_gen)
    eval_gen = ScriptedGenerator(["Answer: x"])
    evaluate(convs, "train", eval_gen, embedder, EvalConfig(baseline="oracle", progress=False), task=TASK,
             cache_dir=tmp_path)
    assert sorted(map(json.dumps, train_gen.prompts)) == sorted(map(json.dumps, eval_gen.prompts))


@pytest.mark.parametrize("stage_name", ["manager", "answer"])
def test_rank_shares_make_up_the_single_process_batch(setup, stage_name):
    _, _, embedder, manager_items_, answer_items_, _ = setup
    cfg = msgspec.structs.replace(FAST, prompts_per_step=4)
    texts = ['{"memory": [{"id": "0", "text": "new fact", "event": "ADD"}]}', "Answer: nothing", "x"]

    def make(rank, world):
        if stage_name == "manager":
            return manager_stage(manager_items_, ScriptedGenerator(["Answer: nothing"]), embedder, cfg, rank, world)
        return AnswerStage(answer_items_, StageContext(embedder, TASK, REWARD, SAMPLING, rank=rank, world=world), cfg)

    for step in (0, 1):
        single = make(0, 1).rollout(step, ScriptedGenerator(texts)).batch.groups
        shares = [make(r, 2).rollout(step, ScriptedGenerator(texts)).batch.groups for r in range(2)]
        assert [len(s) for s in shares] == [2, 2]
        joined = shares[0] + shares[1]
        assert [(g.prompt_ids, g.responses, g.rewards, g.source) for g in joined] == \
            [(g.prompt_ids, g.responses, g.rewards, g.source) for g in single]
