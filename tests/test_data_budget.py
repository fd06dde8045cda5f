"""The budgeted task's data (rl/task/data/budget.py): the properties its docstring promises, checked on
generated conversations: the oracle's merged memories answer what an append-only bank spreads over
several memories, past values survive only in merged memories, and a slot changes at most once a session."""
import re

import pytest

from memr1.rl.task.data import load_conversations, synthesize
from memr1.rl.task.data.budget import CHANGING, changing_memory, synthesize_budget
from memr1.rl.task.data.synthetic import call_ops
from memr1.rl.task.rewards import RewardConfig, manager_reward

N = 30
DATA = synthesize_budget(N, seed=4)


def session_of(dia_id: str) -> int:
    return int(re.match(r"D(\d+):", dia_id).group(1))


def test_it_is_deterministic_a_prefix_and_its_own_set():
    assert synthesize_budget(5, seed=4) == DATA[:5]
    assert synthesize_budget(5, seed=5) != DATA[:5]
    assert {d["sample_id"].split("-")[0] for d in DATA} == {"budget"}
    assert synthesize(3, 4, "budget") == DATA[:3] and synthesize(3, 4)[0]["sample_id"].startswith("synth-")
    with pytest.raises(ValueError, match="kind"):
        synthesize(3, 4, "nope")
    convs = load_conversations(None, N, 4, split="test", kind="budget")
    assert [c.sample_id for c in convs] == ["budget-4-0009", "budget-4-0019", "budget-4-0029"]


def test_each_slot_changes_at_most_once_a_session_in_date_order():
    for d in DATA:
        by_slot: dict[str, list[int]] = {}
        for e in d["memr1_oracle"]["timeline"]:
            by_slot.setdefault(e["slot"], []).append(session_of(e["dia_id"]))
        for sessions in by_slot.values():
            assert sessions == sorted(set(sessions))


def test_the_oracle_s_final_memories_answer_every_question_and_are_fewer_than_the_facts():
    smaller = 0
    for d in DATA:
        final, timeline = d["memr1_oracle"]["final_facts"], d["memr1_oracle"]["timeline"]
        # replaying the oracle's net ops over the whole dialogue gives its final memories
        ops = call_ops(timeline, {e["dia_id"] for e in timeline})
        assert {op["slot"]: op["text"] for op in ops} == final
        for q in d["qa"]:
            assert any(q["answer"] in text for text in final.values()) or (q["memr1_kind"].endswith("-count")
                                                                          and q["answer"] == "1"), q
        for name in (d["conversation"]["speaker_a"], d["conversation"]["speaker_b"]):
            facts = sum(e["speaker"] == name for e in timeline)
            memories = sum(slot.startswith(name + "/") for slot in final)
            smaller += memories < facts
    assert smaller == 2 * N   # every speaker has a changing slot, so merging always saves memories


def test_a_past_value_survives_only_in_the_merged_memory():
    """What makes a destructive UPDATE cost: the fact that reports a change does not hold the value
    before it; the oracle's merged memory does."""
    asked = 0
    for d in DATA:
        timeline = d["memr1_oracle"]["timeline"]
        for q in (q for q in d["qa"] if q["memr1_kind"].endswith("-before")):
            before, change = q["evidence"]
            event = next(e for e in timeline if e["dia_id"] == change)
            assert q["answer"] not in event["fact"] and q["answer"] in event["memory"]
            asked += 1
    assert asked > N


def test_a_changing_memory_lists_earlier_values_newest_first():
    spec = CHANGING["city"]
    assert changing_memory(spec, "Rosa", ["Boston"], "1 May 2023") == "Rosa lives in Boston"
    assert changing_memory(spec, "Rosa", ["Boston", "Austin", "Denver"], "3 May 2023") == \
        "Rosa lives in Denver since 3 May 2023; before that in Austin, and before that in Boston"


def test_the_free_zone_shrinks_with_memory_free_per_fact():
    cfg = RewardConfig(memory_penalty=1.0)
    assert manager_reward([1.0], True, 0, cfg, growth=3, facts=3)["memory"] == 0
    half = RewardConfig(memory_penalty=1.0, memory_free_per_fact=0.5)
    assert manager_reward([1.0], True, 0, half, growth=3, facts=3)["memory"] == -2   # free: floor(1.5) = 1
    assert manager_reward([1.0], True, 0, half, growth=1, facts=3)["memory"] == 0


def test_the_budget_config_loads_and_reads_its_own_data():
    from memr1.engine.config.run import load_config

    cfg = load_config("configs/budget.toml", ["data.n=10"])
    assert cfg.data.kind == "budget" and cfg.answer.top_k_per_speaker == 3 and cfg.stage.answer_warm.banks == "mix"


def test_data_synth_writes_the_budgeted_task(tmp_path, capsys):
    from memr1.engine.cli import main as cli_main
    from memr1.rl.task.data.locomo import load_locomo

    out = tmp_path / "budget.json"
    assert cli_main(["data", "synth", "--kind", "budget", "--out", str(out), "--conversations", "3", "--seed", "4"]) == 0
    assert "3 conversations" in capsys.readouterr().out
    assert [c.sample_id for c in load_locomo(out)] == [d["sample_id"] for d in DATA[:3]]
