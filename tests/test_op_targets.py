"""bench.op_targets: a manager op's id and its copied old_memory, compared on what the shards record."""
import json

from memr1.bench.op_targets import classify, counts, table
from memr1.engine.rollout_files import tables
from memr1.memory_store import HashEmbedder
from memr1.rl.task.agents.answer import AnswerConfig
from memr1.rl.task.agents.manager import ManagerConfig
from memr1.rl.task.data import load_conversations
from memr1.rl.task.facts import oracle_facts
from memr1.rl.task.train_items import ItemsConfig, manager_calls, manager_items, oracle_bank
from memr1.rl.task.stages.calls import ManagerStage, StageConfig
from memr1.rl.task.turns import Task
from memr1.rl.task.stages.context import StageContext
from scripted import ScriptedGenerator

SHOWN = ["Caroline has two dogs", "Mel lives in Paris", "Caroline plays piano"]


def test_each_reference_kind():
    ref = lambda i, old, e="UPDATE": {"event": e, "local_id": i, "old_memory": old}   # noqa: E731
    assert classify(ref(1, " mel LIVES in paris"), SHOWN) == "consistent"   # trimmed, case-folded
    assert classify(ref(0, "Mel lives in Paris"), SHOWN) == "conflict"
    assert classify(ref(2, "Caroline plays the piano"), SHOWN) == "unmatched"
    assert classify(ref(2, None), SHOWN) == "unmatched"
    assert classify(ref(7, "Mel lives in Paris"), SHOWN) == "bad_id" and classify(ref(None, "x"), SHOWN) == "bad_id"
    rows = [{"refs": [ref(0, SHOWN[1]), ref(1, SHOWN[1], "DELETE"), ref(2, SHOWN[2], "NONE")], "shown_texts": SHOWN}]
    by = {r["event"]: r for r in table(counts(rows))}
    assert by["change"]["refs"] == 2 and by["change"]["conflict"] == 1 and by["change"]["conflict_share"] == 0.5
    assert by["NONE"]["consistent"] == 1 and by["UPDATE"]["conflict"] == 1 and by["DELETE"]["consistent"] == 1


def test_a_manager_rollout_records_what_the_measure_needs():
    """A scripted manager UPDATEs shown id 0 while copying shown memory 1's text: the shard's row carries
    the reference and the shown texts, and the measure calls it a conflict."""
    convs = load_conversations(None, n=3, split="train")
    emb = HashEmbedder(32)
    cfg = ManagerConfig(top_k=5, turns_per_call=2, max_new_tokens=64)
    specs = manager_calls(convs, {c.sample_id: oracle_facts(c) for c in convs}, cfg.turns_per_call)
    items = [it for it in manager_items(specs, [oracle_bank(s, s.conv, emb) for s in specs], ItemsConfig(), seed=0)
             if len(it.bank) >= 2][:1]
    stage = ManagerStage(items, ScriptedGenerator(["Answer: x"]),
                         StageContext(emb, Task(manager=cfg, answer=AnswerConfig(max_new_tokens=4))),
                         StageConfig(prompts_per_step=1, group_size=1))
    policy = ScriptedGenerator()
    shown = {}

    def reply(call, i, j):
        user = policy.calls[call][i][-1]["content"]
        shown["texts"] = [m["text"] for m in json.loads(user.split("Existing memories:\n", 1)[1].split("\n\n", 1)[0])]
        return json.dumps({"memory": [{"text": "new", "event": "UPDATE", "old_memory": shown["texts"][1], "id": "0"}]})
    policy.reply = reply
    rollout = stage.rollout(0, policy)
    sample = rollout.samples[0]
    assert sample.shown_texts == shown["texts"] and len(sample.shown_ids) == len(shown["texts"]) >= 2
    assert sample.refs == [{"event": "UPDATE", "local_id": 0, "old_memory": shown["texts"][1]}]
    completions, _ = tables(rollout, 0, 0, 1.0)
    row = completions.select(["refs", "shown_texts"]).to_pylist()
    assert {r["event"]: r["conflict"] for r in table(counts(row))}["change"] == 1
