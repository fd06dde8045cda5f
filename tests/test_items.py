"""rl.items: every train question reaches stage 1, calls are cut as evaluation cuts them, the bank
before a call holds exactly its history, rank shares partition each step. (That training never draws
the val split is checked on a whole run in test_train.)"""
from pathlib import Path

import pytest

from memr1.memory_store import HashEmbedder
from memr1.rl.banks import oracle_facts, stream_groups
from memr1.rl.data import load_conversations
from memr1.rl.items import (ItemsConfig, history_conversation, in_history, manager_calls, manager_items, oracle_bank,
                            step_items)

LOCOMO = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo_train_val.json"


def every_question_reaches_an_item(convs, facts, turns_per_call, per_item):
    specs = manager_calls(convs, facts, turns_per_call)
    items = manager_items(specs, [None] * len(specs), ItemsConfig(max_questions_per_item=per_item), seed=0)
    got = sorted((it.conversation, q.question) for it in items for q in it.questions)
    want = sorted((c.sample_id, q.question) for c in convs for q in c.qa)
    assert got == want   # each question exactly once
    assert all(1 <= len(it.questions) <= per_item for it in items)
    return specs


@pytest.mark.parametrize("turns_per_call, per_item", [(1, 2), (3, 1)])
def test_every_synthetic_question_reaches_stage_1(turns_per_call, per_item):
    convs = load_conversations(None, n=10, split="train")
    every_question_reaches_an_item(convs, {c.sample_id: oracle_facts(c) for c in convs}, turns_per_call, per_item)


@pytest.mark.skipif(not LOCOMO.is_file(), reason=f"needs the LoCoMo file at {LOCOMO} (not shipped)")
def test_every_locomo_train_question_reaches_stage_1():
    """The 152 train QA of conv-26, with facts on only some turns (as extraction leaves many turns
    empty): questions whose evidence turn has none go to the nearest earlier call."""
    convs = load_conversations(str(LOCOMO), split="train")
    assert sum(len(c.qa) for c in convs) == 152
    facts = {c.sample_id: [[t.text] if i % 3 == 0 else [] for i, t in enumerate(c.turns())] for c in convs}
    every_question_reaches_an_item(convs, facts, 2, 2)


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
