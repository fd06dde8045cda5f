"""rl.task.eval.op_probe: each one-mistake reply changes the bank the way its name says, against the oracle's
reply on the same fork; the probe scores them through ManagerStage.score; bench.op_probe's headline is
each variant's share of items whose reward differs."""
import json
from collections import Counter

from memr1.bench.op_probe import headline

from memr1.memory_store import HashEmbedder
from memr1.rl.task.agents.answer import AnswerConfig
from memr1.rl.task.agents.manager import ManagerConfig
from memr1.rl.task.facts import oracle_facts
from memr1.rl.task.data import load_conversations
from memr1.rl.task.train_items import ItemsConfig, manager_calls, manager_items, oracle_banks
from memr1.rl.task.eval.op_probe import VARIANTS, op_visibility, wrong_replies
from memr1.rl.task.rewards import RewardConfig
from memr1.rl.task.stages.calls import ManagerStage, StageConfig
from memr1.rl.task.turns import Task, apply_outcomes, decide, manager_turns
from memr1.rl.task.stages.context import StageContext

MANAGER = ManagerConfig(top_k=5, turns_per_call=2, list_unchanged=False)


def setup_items(n=20):
    embedder = HashEmbedder(64)
    convs = load_conversations(None, n=n, split="train")
    specs = manager_calls(convs, {c.sample_id: oracle_facts(c) for c in convs}, 2, every_call=True)
    banks = oracle_banks(specs, embedder)
    turns = manager_turns([(b, s.call) for s, b in zip(specs, banks)],
                          embedder, MANAGER)
    shown = [[b.get(i).text for i in t.prompt.bank_ids] for t, b in zip(turns, banks)]
    items = manager_items(specs, banks, ItemsConfig(guard_questions=2), 0, shown, keep_empty=False)
    return embedder, convs, items


def texts_after(item, turn, reply, embedder) -> Counter:
    fork = item.bank.fork()
    outcome = decide([(turn, reply)], embedder, MANAGER)[0]
    assert outcome.status == "ok", (reply, outcome)
    apply_outcomes(fork, [outcome])
    return Counter(m.text for m in fork)


def test_each_variant_makes_its_one_mistake():
    embedder, convs, items = setup_items()
    oracles = {c.sample_id: c.oracle for c in convs}
    seen = Counter()
    for it in items:
        turn = manager_turns([(it.bank, it.call)], embedder,
                             MANAGER)[0]
        shown = [it.bank.get(i).text for i in turn.prompt.bank_ids]
        target, wrong = wrong_replies(it, shown, oracles[it.conversation], False, turn)
        good = texts_after(it, turn, target, embedder)
        before = Counter(m.text for m in it.bank)
        for variant, reply in wrong.items():
            seen[variant] += 1
            bad = texts_after(it, turn, reply, embedder)
            extra, missing = bad - good, good - bad
            if variant in ("UPDATE:as_add", "DELETE:skip"):
                # the memory the oracle changes or drops is still there, beside what it writes
                assert sum(extra.values()) == 1 and not missing and set(extra) <= set(before)
            elif variant == "ADD:skip":
                assert not extra and sum(missing.values()) == 1
            elif variant == "ADD:overwrite":
                assert sum(missing.values()) == 1 and set(missing) == {shown[0]} and not extra
            elif variant == "UPDATE:wrong_id":
                # the stale memory stays, another shown one is lost to the new fact
                assert sum(extra.values()) == sum(missing.values()) == 1
                assert set(extra) <= set(before) and set(missing) <= set(shown)
            elif variant == "NONE:add":   # a second memory (its text may equal the restated one)
                assert sum(extra.values()) == 1 and not missing
            else:   # NONE:update: the restated memory is replaced by the restatement (a no-op when they match)
                assert sum(extra.values()) == sum(missing.values()) <= 1 and set(missing) <= set(before)
                seen["vaguer"] += bool(missing)
    assert seen["vaguer"] >= 3
    assert all(seen[v] >= 3 for v in VARIANTS), seen


class EchoAnswerer:
    """Answers every question with the first memory it is shown (or "none"): a frozen answerer
    whose score depends on the bank."""

    def generate(self, prompts, n, sampling):
        from types import SimpleNamespace
        out = []
        for p in prompts:
            lines = [x for x in p[-1]["content"].splitlines() if x.startswith("- ")]
            text = lines[0].split("] ", 1)[-1] if lines else "none"
            out.append([SimpleNamespace(text=f"Answer: {text}", token_ids=[1], finish_reason="stop")])
        return out


def test_the_probe_scores_every_variant_through_the_stage():
    embedder, convs, items = setup_items()
    task = Task(manager=MANAGER, answer=AnswerConfig(top_k_per_speaker=5, distill=False))
    stage = ManagerStage(items, EchoAnswerer(), StageContext(embedder, task, RewardConfig(kind="f1")),
                         StageConfig(steps=1, prompts_per_step=1, group_size=1))
    found = op_visibility(stage, items[:60], {c.sample_id: c.oracle for c in convs})
    assert set(found) == set(VARIANTS)
    for v, r in found.items():
        assert r["items"] == 0 or 0 <= r["differ"] <= r["items"]
    assert any(r["differ"] for r in found.values())   # the F1 of an echo answer does depend on the bank
    head = headline([{"variant": v, **found[v]} for v in VARIANTS])   # the bench's rows
    assert [(h["name"], h["ours"], h["baseline"]) for h in head] == [
        (f"{v}: reward differs", v, "oracle reply") for v in VARIANTS]
    assert [h["value"] for h in head] == [found[v]["share"] for v in VARIANTS]


def test_headline_is_each_variants_share_and_none_without_items():
    rows = [{"variant": "ADD:skip", "items": 4, "differ": 3, "share": 0.75},
            {"variant": "DELETE:skip", "items": 0, "differ": 0, "share": None}]
    add, delete = headline(rows)
    assert add["value"] == 0.75 and add["unit"] == "share" and add["items"] == 4 and add["differ"] == 3
    assert (add["ours"], add["baseline"], add["better"]) == ("ADD:skip", "oracle reply", "higher")
    assert delete["value"] is None and delete["met"] is None


def test_decision_positions_point_at_each_ops_event_and_the_id_after_its_copy(tiny_model):
    from transformers import AutoTokenizer

    from memr1.rl.task.agents.manager import reply_item
    from memr1.rl.generation import reply_ids
    from memr1.rl.task.eval.op_probe import decision_positions

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    reply = json.dumps({"memory": [reply_item("UPDATE", 3, "Ann has 2 dogs", 'Ann has 1 "dog"'),
                                   reply_item("DELETE", 12, old_memory="Ann, a nurse, \\ works nights"),
                                   reply_item("ADD", text="Ann likes tea")]})
    tokens = reply_ids(tokenizer, reply)
    found = decision_positions(reply, tokenizer)
    assert [(d, e) for d, e, _ in found] == [("event", "UPDATE"), ("event", "DELETE"), ("event", "ADD"),
                                             ("id", "UPDATE"), ("id", "DELETE")]
    values = ["UPDATE", "DELETE", "ADD", "3", "12"]
    for (_, _, i), value in zip(found, values):   # the reply from that token on starts with the value
        assert tokenizer.decode(tokens[i:]).lstrip(' "').startswith(value), (i, value)
        assert not tokenizer.decode(tokens[i - 1:i]).strip(' "')   # and the token before holds none of it


def test_decision_probs_count_every_decision_of_every_reply(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memr1.rl.task.eval.op_probe import decision_probs

    tokenizer, model = AutoTokenizer.from_pretrained(tiny_model), AutoModelForCausalLM.from_pretrained(tiny_model)
    embedder, convs, items = setup_items(6)
    turns = manager_turns([(it.bank, it.call) for it in items[:8]], embedder, MANAGER)
    replies = [wrong_replies(it, [it.bank.get(i).text for i in t.prompt.bank_ids],
                             next(c for c in convs if c.sample_id == it.conversation).oracle, False, t)[0]
               for it, t in zip(items, turns)]
    found = decision_probs(model, tokenizer, [t.prompt.messages for t in turns], replies)
    ops = Counter(op["event"] for r in replies for op in json.loads(r)["memory"])
    assert {e: len(ps) for (d, e), ps in found.items() if d == "event"} == dict(ops)
    assert all(0 < p <= 1 for ps in found.values() for p in ps)


def test_a_run_directory_without_a_config_is_a_one_line_error(tmp_path):
    import pytest

    from memr1.bench.op_probe import main

    for extra in ([], ["--decisions"]):
        with pytest.raises(SystemExit, match=r"^error: --run .*: no config.toml there") as e:
            main(["--run", str(tmp_path), "--json", str(tmp_path / "out.json"), *extra])
        assert "\n" not in str(e.value) and not (tmp_path / "out.json").exists()
