import json
import re
from collections import Counter
from types import SimpleNamespace

import pytest

from memr1.engine.cli import main as cli_main
from memr1.rl.task.data.locomo import load_locomo
from memr1.rl.task.data.oracle import apply_oracle
from memr1.rl.task.data import load_conversations
from memr1.rl.task.data.synth_cli import synth_cli
from memr1.rl.task.data.synthetic import call_ops, split_for, synthesize

N = 40


@pytest.fixture(scope="module")
def data():
    return synthesize(N, seed=3)


def test_deterministic_and_prefix_stable(data):
    assert json.dumps(synthesize(N, seed=3)) == json.dumps(data)
    assert json.dumps(synthesize(5, seed=3)) == json.dumps(data[:5])
    assert json.dumps(synthesize(5, seed=4)) != json.dumps(data[:5])


def test_oracle_replays_to_final_facts_on_a_dict(data):
    events = Counter()
    for conv in data:
        oracle = conv["memr1_oracle"]
        assert apply_oracle(oracle["timeline"]) == oracle["final_facts"]
        events.update(e["event"] for e in oracle["timeline"])
    assert all(events[e] > 0 for e in ("ADD", "UPDATE", "DELETE", "NONE")), events


def test_oracle_rejects_an_inconsistent_timeline(data):
    timeline = [dict(e) for e in data[0]["memr1_oracle"]["timeline"]]
    first_update = next(e for e in timeline if e["event"] in ("UPDATE", "DELETE", "NONE"))
    first_update["old_memory"] = "something else"
    with pytest.raises(ValueError, match="expects"):
        apply_oracle(timeline)


@pytest.mark.parametrize("size", [1, 2, 3, 6])
def test_call_ops_replay_each_chunk_of_events_with_one_op_per_memory(data, size):
    """Applied to the state before a chunk of consecutive events, the chunk's net ops give the state
    after it, touching each memory at most once; within-chunk chains do occur."""
    folded = 0
    for conv in data:
        timeline = conv["memr1_oracle"]["timeline"]
        state = {}
        for i in range(0, len(timeline), size):
            chunk = timeline[i:i + size]
            ops = call_ops(timeline, {e["dia_id"] for e in chunk})
            for op in ops:
                slot = op["slot"]
                if op["event"] == "ADD":
                    assert slot not in state
                    state[slot] = op["text"]
                else:
                    assert state[slot] == op["old_memory"]
                    if op["event"] == "UPDATE":
                        state[slot] = op["text"]
                    elif op["event"] == "DELETE":
                        del state[slot]
            assert state == apply_oracle(timeline[:i + size])
            assert len({(op["slot"], op["event"] == "ADD") for op in ops}) == len(ops)
            folded += len(chunk) - len(ops)
    assert (folded > 0) == (size > 1)


def test_call_ops_fold_a_chain_into_one_op_in_the_order_of_the_facts():
    add = {"dia_id": "D1:1", "slot": "a/pet", "event": "ADD", "memory": "A has 1 dog", "fact": "A got a dog"}
    more = {"dia_id": "D1:3", "slot": "a/pet", "event": "UPDATE", "memory": "A has 2 dogs", "old_memory": "A has 1 dog",
            "fact": "A got a second dog"}
    same = {"dia_id": "D1:5", "slot": "a/city", "event": "NONE", "memory": "A lives in Oslo",
            "old_memory": "A lives in Oslo", "fact": "A still lives in Oslo"}
    gone = {"dia_id": "D1:7", "slot": "a/pet", "event": "DELETE", "memory": "A has 1 dog", "old_memory": "A has 1 dog",
            "fact": "A gave the dog away"}
    timeline = [add, more, same, gone]
    assert call_ops(timeline, ["D1:1", "D1:3"]) == [
        {"event": "ADD", "slot": "a/pet", "text": "A has 2 dogs", "fact": "A got a second dog"}]
    assert call_ops(timeline, ["D1:3", "D1:5"]) == [
        {"event": "UPDATE", "slot": "a/pet", "text": "A has 2 dogs", "fact": "A got a second dog",
         "old_memory": "A has 1 dog"},
        {"event": "NONE", "slot": "a/city", "text": "A lives in Oslo", "fact": "A still lives in Oslo",
         "old_memory": "A lives in Oslo"}]
    assert call_ops(timeline, ["D1:1", "D1:7"]) == []
    # an ADD before a restatement comes first: ops follow the facts, not "memories first, ADDs last"
    assert [op["fact"] for op in call_ops(timeline, ["D1:5", "D1:1"])] == ["A got a dog", "A still lives in Oslo"]
    assert [op["fact"] for op in call_ops(timeline, ["D1:5", "D1:7"])] == [
        "A still lives in Oslo", "A gave the dog away"]


def test_timeline_points_at_real_turns(data):
    for conv in data:
        turns = {t["dia_id"]: t for k, v in conv["conversation"].items() if isinstance(v, list) for t in v}
        for e in conv["memr1_oracle"]["timeline"]:
            assert turns[e["dia_id"]]["speaker"] == e["speaker"]
            assert e["fact"].startswith(e["speaker"])
        # chit-chat: most turns carry no fact
        assert len(turns) > len(conv["memr1_oracle"]["timeline"])


def test_answers_follow_the_latest_state(data):
    """Every single-hop answer appears in the final memory of the slot its evidence set."""
    checked = 0
    for conv in data:
        oracle = conv["memr1_oracle"]
        final_texts = set(oracle["final_facts"].values())
        by_dia = {e["dia_id"]: e for e in oracle["timeline"]}
        for qa in conv["qa"]:
            assert qa["category"] in (1, 2, 3, 4) and qa["answer"] and len(qa["answer"].split()) <= 6
            if qa["memr1_kind"].endswith("-none"):   # its slot was emptied by the DELETE it cites
                (ev,) = qa["evidence"]
                assert qa["answer"] == "none" and by_dia[ev]["event"] == "DELETE"
                assert by_dia[ev]["slot"] not in oracle["final_facts"]
                continue
            for ev in qa["evidence"]:
                assert by_dia[ev]["memory"] in final_texts      # evidence is still live at the end
            if qa["category"] == 1:
                memory = by_dia[qa["evidence"][0]]["memory"]
                assert re.search(rf"\b{re.escape(qa['answer'])}\b", memory), (qa, memory)
                checked += 1
        counts = [q for q in conv["qa"] if q["memr1_kind"] == "count"]
        for q in counts:   # the count is the latest one, after any second adoption
            assert by_dia[q["evidence"][0]]["memory"].split(" has ")[1].startswith(q["answer"] + " ")
    assert checked > 100


def test_add_dominates_and_every_op_kind_has_questions(data):
    """Speakers have many distinct facts, so most fact turns are ADDs (as in real dialogue), and each
    op kind decides some answer: DELETEs give "none" answers, UPDATEs the latest value, restatements
    of detailed memories say less than the memory holds."""
    events = Counter(e["event"] for c in data for e in c["memr1_oracle"]["timeline"])
    total = sum(events.values())
    assert events["ADD"] / total > 0.55 and min(events.values()) / total > 0.04, events
    by_event = Counter()
    vaguer = 0
    for conv in data:
        by_dia = {e["dia_id"]: e for e in conv["memr1_oracle"]["timeline"]}
        for qa in conv["qa"]:
            by_event.update({by_dia[ev]["event"] for ev in qa["evidence"]})
        for e in by_dia.values():
            vaguer += e["event"] == "NONE" and len(e["fact"]) < len(e["old_memory"])
    assert all(by_event[k] > 20 for k in ("ADD", "UPDATE", "DELETE")), by_event
    assert vaguer > 20
    facts = [len(c["memr1_oracle"]["final_facts"]) / 2 for c in data]
    assert sum(facts) / len(facts) > 6   # more facts per speaker than the answer agent's top 5


def test_variety_and_categories(data):
    texts = {t["text"] for c in data for k, v in c["conversation"].items() if isinstance(v, list) for t in v}
    assert len(texts) > 300
    cats = Counter(q["category"] for c in data for q in c["qa"])
    assert all(cats[k] >= 10 for k in (1, 2, 3, 4)), cats
    names = {c["conversation"]["speaker_a"] for c in data}
    assert len(names) > 10


def test_split_and_loader(data):
    assert [split_for(i) for i in range(10)] == ["train"] * 8 + ["val", "test"]
    convs = load_conversations(None, N, seed=3)
    assert Counter(c.split for c in convs) == {"train": 32, "val": 4, "test": 4}
    assert [c.sample_id for c in load_conversations(None, N, seed=3, split="val")] == ["synth-3-0008", "synth-3-0018",
                                                                             "synth-3-0028", "synth-3-0038"]
    assert convs[0].oracle == data[0]["memr1_oracle"]
    assert all(q.kind for c in convs for q in c.qa)


def test_synth_cli_writes_a_loadable_file(tmp_path, capsys):
    out = tmp_path / "synth.json"
    assert cli_main(["data", "synth", "--out", str(out), "--conversations", "12", "--seed", "7"]) == 0
    assert "12 conversations" in capsys.readouterr().out
    convs = load_locomo(out)
    assert len(convs) == 12 and convs[0].sample_id == "synth-7-0000"
    assert json.loads(out.read_text()) == synthesize(12, seed=7)
    assert synth_cli(SimpleNamespace(out=str(out), conversations=0, seed=0, kind="synthetic")) == 2
    assert "--conversations must be 1 to" in capsys.readouterr().err
    assert synth_cli(SimpleNamespace(out=str(out), conversations=10 ** 9, seed=0, kind="synthetic")) == 2   # refused at once
    assert "--conversations must be 1 to" in capsys.readouterr().err
    # a device where the file cannot be written (a full disk, /proc) is one line, and no torn file stays
    assert cli_main(["data", "synth", "--out", "/proc/memr1-synth.json", "--conversations", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out /proc/memr1-synth.json: cannot write it") and err.count("\n") == 1
    # Only the file is created, never a folder for it (a mistyped path is an error).
    assert cli_main(["data", "synth", "--out", str(tmp_path / "sub" / "x.json")]) == 2
    assert "does not exist" in capsys.readouterr().err and not (tmp_path / "sub").exists()
    assert cli_main(["data", "synth", "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_oracle_on_a_real_memory_bank(data):
    store = pytest.importorskip("memr1.memory_store", reason="memory_store not importable")
    if not hasattr(store, "MemoryBank"):
        pytest.skip("memr1.memory_store.MemoryBank has not landed yet")
    embedder = store.HashEmbedder(dim=64)
    for conv in data[:10]:
        bank, ids = store.MemoryBank.create(None, dim=64), {}
        for e in conv["memr1_oracle"]["timeline"]:
            if e["event"] == "ADD":
                ids[e["slot"]] = bank.apply(store.Add(text=e["memory"], vector=embedder.embed([e["memory"]])[0],
                                                      speaker=e["speaker"], timestamp=e["date"]))
            elif e["event"] == "UPDATE":
                bank.apply(store.Update(id=ids[e["slot"]], text=e["memory"], vector=embedder.embed([e["memory"]])[0]))
            elif e["event"] == "DELETE":
                bank.apply(store.Delete(id=ids.pop(e["slot"])))
            else:
                assert bank.get(ids[e["slot"]]).text == e["old_memory"]
                bank.apply(store.Noop())
        assert len(bank) == len(conv["memr1_oracle"]["final_facts"])
        assert {slot: bank.get(i).text for slot, i in ids.items()} == conv["memr1_oracle"]["final_facts"]
