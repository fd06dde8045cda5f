"""rl.task.train_items: each question sits in the call that decides it, guards sit on shown memories of the
history, calls are cut as evaluation cuts them, the bank before a call holds exactly its history,
rank shares partition each step. (That training never draws
the val split is checked on a whole run in test_train.)"""
from pathlib import Path

import pytest

from memr1.memory_store import HashEmbedder
from memr1.rl.task.agents.manager import ManagerConfig
from memr1.rl.task.banks import stream_groups
from memr1.rl.task.facts import oracle_facts
from memr1.rl.task.data import load_conversations
from memr1.rl.task.train_items import (CallSpec, CallStats, ItemsConfig, ManagerItem, dead_items, history_conversation,
                            in_history, live_questions, manager_calls, manager_items, mixed_answer_items, oracle_bank,
                            oracle_banks, step_items)
from memr1.rl.task.turns import manager_turns

LOCOMO = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo_train_val.json"


def assert_each_question_in_the_call_that_decides_it(convs, facts, turns_per_call, per_item):
    """Every item's questions have their last fact-bearing evidence turn inside the item's call and
    every other fact-bearing evidence turn in the call's bank history, never after the call; each
    question with a fact-bearing evidence turn is decided exactly once, the others are counted."""
    stats = CallStats()
    specs = manager_calls(convs, facts, turns_per_call, stats=stats)
    items = manager_items(specs, [None] * len(specs), ItemsConfig(max_questions_per_item=per_item), seed=0)
    by_id = {c.sample_id: c for c in convs}
    for it in items:
        conv = by_id[it.conversation]
        turns, f = conv.turns(), facts[conv.sample_id]
        order = {t.dia_id: i for i, t in enumerate(turns)}
        inside = {order[d] for d in it.call["dia_ids"]}
        spec = CallSpec(conv, it.call, it.decided, min(inside), max(inside) + 1)
        assert 1 <= len(it.decided) <= per_item
        for qa in it.decided:
            bearing = [order[e] for e in qa.evidence if e in order and f[order[e]]]
            assert max(bearing) in inside, (it.source, qa.question, qa.evidence)
            assert all(i in inside or in_history(spec, i, turns[i].speaker) for i in bearing)
    got = sorted((it.conversation, q.question) for it in items for q in it.decided)
    reachable = []
    for c in convs:
        order = {t.dia_id: i for i, t in enumerate(c.turns())}
        reachable += [(c.sample_id, q.question) for q in c.qa
                      if any(e in order and facts[c.sample_id][order[e]] for e in q.evidence)]
    assert got == sorted(reachable)   # each reachable question exactly once
    assert stats.questions == sum(len(c.qa) for c in convs)
    assert stats.unreachable == stats.questions - len(reachable)
    return specs


@pytest.mark.parametrize("turns_per_call, per_item", [(1, 2), (2, 2), (3, 1)])
def test_each_synthetic_question_sits_in_the_call_that_decides_it(turns_per_call, per_item):
    convs = load_conversations(None, n=30, split="train")
    assert_each_question_in_the_call_that_decides_it(convs, {c.sample_id: oracle_facts(c) for c in convs},
                                                     turns_per_call, per_item)


@pytest.mark.skipif(not LOCOMO.is_file(), reason=f"needs the LoCoMo file at {LOCOMO} (not shipped)")
def test_each_locomo_question_sits_in_the_call_that_decides_it():
    """conv-26 and conv-30, with facts on only some turns (as extraction leaves many turns empty): an
    evidence turn without facts never picks the call, and a question with no fact-bearing evidence is
    counted as unreachable."""
    convs = load_conversations(str(LOCOMO))
    assert sum(len(c.qa) for c in convs) == 152 + 81
    facts = {c.sample_id: [[t.text] if i % 3 == 0 else [] for i, t in enumerate(c.turns())] for c in convs}
    for turns_per_call in (1, 2):
        assert_each_question_in_the_call_that_decides_it(convs, facts, turns_per_call, 2)


def test_guard_questions_are_on_shown_memories_of_the_history_and_no_item_is_dead():
    """Guards (oracle data): every evidence turn in the call's history, an evidence memory among the
    memories its prompt shows; calls that decide nothing (restatements) still reach RL through them."""
    embedder = HashEmbedder(64)
    convs = load_conversations(None, n=20, split="train")
    facts = {c.sample_id: oracle_facts(c) for c in convs}
    cfg = ManagerConfig(top_k=5, turns_per_call=2, list_unchanged=False)
    specs = manager_calls(convs, facts, 2, every_call=True)
    banks = oracle_banks(specs, embedder)
    turns = manager_turns([(b, s.call) for s, b in zip(specs, banks)],
                          embedder, cfg)
    shown = [[b.get(i).text for i in t.prompt.bank_ids] for t, b in zip(turns, banks)]
    items = manager_items(specs, banks, ItemsConfig(guard_questions=2), 0, shown, keep_empty=False)
    oracles = {c.sample_id: c.oracle for c in convs}
    guard_only = 0
    for it in items:
        conv = next(c for c in convs if c.sample_id == it.conversation)
        order = {t.dia_id: i for i, t in enumerate(conv.turns())}
        spec = CallSpec(conv, it.call, it.decided, order[it.call["dia_ids"][0]], order[it.call["dia_ids"][-1]] + 1)
        memory = {e["dia_id"]: (e["memory"], e["speaker"]) for e in conv.oracle["timeline"]}
        assert it.questions and len(it.guards) <= 2
        for qa in it.guards:
            assert qa not in it.decided
            assert all(in_history(spec, order[e], memory[e][1]) for e in qa.evidence)
            assert any(memory[e][0] in it.shown for e in qa.evidence)
        guard_only += not it.decided
        assert all(live_questions(it, conv.oracle))   # every question can be changed by the call
    assert guard_only > 10
    assert dead_items(items, oracles) == 0
    # an item whose questions lie outside its call and its prompt is dead
    dead = ManagerItem(items[0].conversation, items[0].call, None, [], items[0].speakers,
                       [q for q in next(c for c in convs if c.sample_id == items[0].conversation).qa
                        if not set(q.evidence) & set(items[0].call["dia_ids"])][:1], shown=[])
    assert dead_items([dead], oracles) == 1


def test_a_call_is_cut_like_evaluation_and_its_bank_holds_its_history():
    embedder = HashEmbedder(64)
    conv = load_conversations(None, n=3, split="train")[0]
    facts = oracle_facts(conv)
    specs = manager_calls([conv], {conv.sample_id: facts}, 2, every_call=True)
    eval_calls = [g for gs in stream_groups(conv.turns(), facts, 2).values() for g in gs]
    assert sorted(tuple(s.call["dia_ids"]) for s in specs) == sorted(tuple(g["dia_ids"]) for g in eval_calls)
    order = {t.dia_id: i for i, t in enumerate(conv.turns())}
    for spec in specs:
        bank = oracle_bank(spec, conv, embedder)
        # the oracle's state after exactly the events in the call's history
        state = {}
        for e in conv.oracle["timeline"]:
            if in_history(spec, order[e["dia_id"]], e["speaker"]):
                if e["event"] in ("ADD", "UPDATE"):
                    state[e["slot"]] = e["memory"]
                elif e["event"] == "DELETE":
                    state.pop(e["slot"])
        assert sorted(m.text for m in bank) == sorted(state.values())
        # the manager pipeline's history conversation: the preceding window, the call's own turns blanked
        hist, hist_facts = history_conversation(spec, facts, window=4)
        turns = hist.turns()
        assert len(turns) == spec.end - max(0, spec.first - 4) and turns[-1].dia_id == spec.call["dia_ids"][-1]
        own_later = [f for t, f in zip(turns, hist_facts) if t.speaker == spec.call["speaker"]
                     and order[t.dia_id] >= spec.first]
        assert all(f == [] for f in own_later)


def test_rank_shares_partition_each_step():
    items = list(range(10))
    for step in range(4):
        whole = step_items(items, step, 4)
        assert step_items(items, step, 4, 0, 2) + step_items(items, step, 4, 1, 2) == whole
    with pytest.raises(ValueError, match="no training items"):
        step_items([], 0, 4)


def test_mixed_answer_items_put_each_question_once_on_alternate_banks():
    """items.answer_banks = "mix": every question of answer_items, in its order, once; half on each
    source's bank, and each conversation's questions on both."""
    from memr1.rl.task.train_items import answer_items
    from memr1.rl.task.rag import fact_bank

    convs = load_conversations(None, 6, 0, split="train")
    emb = HashEmbedder(dim=32)
    oracle = {c.sample_id: oracle_bank(None, c, emb) for c in convs}
    facts = {c.sample_id: oracle_facts(c) for c in convs}
    add_all = {c.sample_id: fact_bank(c.turns(), facts[c.sample_id], emb) for c in convs}
    plain = answer_items(convs, oracle, seed=3)
    mixed = mixed_answer_items(convs, oracle, add_all, seed=3)
    assert [(it.conversation, it.question.question) for it in mixed] == [(it.conversation, it.question.question) for it in plain]
    on_oracle = [it.bank is oracle[it.conversation] for it in mixed]
    assert [it.bank is add_all[it.conversation] for it in mixed] == [not o for o in on_oracle]
    assert abs(2 * sum(on_oracle) - len(mixed)) <= 1
    for c in convs:
        kinds = {o for it, o in zip(mixed, on_oracle) if it.conversation == c.sample_id}
        assert len([it for it in mixed if it.conversation == c.sample_id]) < 2 or kinds == {True, False}
    assert len(add_all[convs[0].sample_id]) > len(oracle[convs[0].sample_id])   # stale copies stay in ADD-all banks


def test_a_run_s_answer_stage_reads_the_mix_when_configured():
    """engine/items.py: answer_banks = "mix" gives the answer stage mixed_answer_items; its warm start
    stays on the oracle's banks."""
    from types import SimpleNamespace

    from memr1.engine.config.run import load_config
    from memr1.engine.items import RunItems

    run = SimpleNamespace(cfg=load_config(None, ["data.n=20", "items.answer_banks=mix"]), seed=0)
    items = RunItems(run, HashEmbedder(dim=32), None, "val")
    items._facts = {c.sample_id: oracle_facts(c) for c in items.convs}
    trained, warm = items.answer("answer", None), items.answer("answer_warm", None)
    oracle_sizes = {c.sample_id: len(oracle_bank(None, c, HashEmbedder(dim=32))) for c in items.convs}
    assert [len(it.bank) == oracle_sizes[it.conversation] for it in warm] == [True] * len(warm)
    assert {len(it.bank) == oracle_sizes[it.conversation] for it in trained} == {True, False}


def test_a_reader_warm_start_reads_the_mix_when_its_banks_say_so():
    """stage.answer_warm.banks = "mix": the supervised reader's items alternate the oracle's and
    ADD-every-fact banks (configs/budget.toml); the manager's warm start and a format pool refuse it."""
    from types import SimpleNamespace

    from memr1.engine.config.errors import ConfigError
    from memr1.engine.config.run import load_config
    from memr1.engine.items import RunItems

    run = SimpleNamespace(cfg=load_config(None, ["data.n=20", "stage.answer_warm.banks=mix"]), seed=0)
    items = RunItems(run, HashEmbedder(dim=32), None, "val")
    items._facts = {c.sample_id: oracle_facts(c) for c in items.convs}
    oracle_sizes = {c.sample_id: len(oracle_bank(None, c, HashEmbedder(dim=32))) for c in items.convs}
    assert {len(it.bank) == oracle_sizes[it.conversation] for it in items.answer("answer_warm", None)} == {True, False}
    with pytest.raises(ConfigError, match="manager_warm.banks"):
        load_config(None, ["stage.manager_warm.banks=mix"])
    with pytest.raises(ConfigError, match="pool_seed"):
        load_config(None, ["stage.answer_warm.banks=mix", "stage.answer_warm.pool_seed=7"])
