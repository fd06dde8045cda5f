import json

import numpy as np
import pytest

from memr1.memory_store import HashEmbedder, MemoryBank
from memr1.rl.task.agents.answer import (MAX_REPLY_CHARS, AnswerConfig, build_answer_messages, reply_bound, longest_reply_to_fit,
                                    parse_answer)
from memr1.rl.task.agents.extract import EXAMPLES, build_extract_messages, grounded, parse_facts
from memr1.rl.task.agents.manager import (ManagerConfig, ManagerOp, build_manager_prompt, memories_for_facts, reply_item,
                                     parse_manager_output, to_store_ops)
from memr1.rl.task.data.synthetic import synthesize
from memr1.rl.task.rewards import RewardConfig, manager_reward
from memr1.rl.task.turns import AnswerRequest, answer_prompts

DIM = 64


def store(ops, bank_ids, emb, speaker, timestamp=""):
    """to_store_ops with the ADD / UPDATE texts embedded in one call, as rl.task.turns.decide does."""
    texts = [op.text for op in ops if op.event in ("ADD", "UPDATE")]
    return to_store_ops(ops, bank_ids, emb.embed(texts) if texts else [], speaker, timestamp)


class CountingEmbedder(HashEmbedder):
    def __init__(self):
        super().__init__(dim=DIM)
        self.calls = 0

    def embed(self, texts):
        self.calls += 1
        return super().embed(texts)


# ---- extraction ----
def test_extract_prompt_and_parser():
    msgs = build_extract_messages("Andrew", "I adopted a dog yesterday!", "1:56 pm on 8 May, 2023",
                                  context=[("Bea", "Any news?")])
    assert msgs[0]["role"] == "system" and "relative dates" in msgs[0]["content"]
    assert "8 May, 2023" in msgs[-1]["content"]
    assert "Bea: Any news?" in msgs[-1]["content"] and "Andrew: I adopted a dog yesterday!" in msgs[-1]["content"]
    # the worked examples alternate user / assistant turns, and each answer parses to its facts
    assert [m["role"] for m in msgs[1:-1]] == ["user", "assistant"] * len(EXAMPLES)
    assert [parse_facts(m["content"]).facts for m in msgs[2:-1:2]] == [list(e[3]) for e in EXAMPLES]
    with pytest.raises(TypeError, match="speaker"):
        build_extract_messages(None, "x")
    r = parse_facts('```json\n{"facts": ["Andrew has 1 dog", "Andrew has 1 dog", "", 3]}\n```')
    assert r.parsed and r.facts == ["Andrew has 1 dog"]
    assert parse_facts('["a", {"fact": "b"}]').facts == ["a", "b"]
    r = parse_facts("Here you go:\n- Andrew has 1 dog\n2. Andrew lives in Lyon")
    assert not r.parsed and r.facts == ["Andrew has 1 dog", "Andrew lives in Lyon"]
    assert parse_facts('{"facts": []}').facts == [] and parse_facts('{"facts": []}').parsed
    assert parse_facts(None).facts == [] and parse_facts('{"other": 1}').error


def test_extract_grounded_drops_invented_facts():
    facts = ["Mel has a new baby", "Mel went to a support group", "Caroline loves Mel", "Mel's dog Luna is 3"]
    # names and filler words never ground a fact; a content word of the turn or its context does
    names = ["Mel", "Caroline"]
    assert grounded(facts, "Hey Caroline! I went to my support group.", names) == ["Mel went to a support group"]
    assert grounded(facts, "Thanks! How old is your dog?", names) == ["Mel's dog Luna is 3"]
    assert grounded(facts, "", names) == [] and grounded(facts, "Hey Caroline!", []) == ["Caroline loves Mel"]


# ---- manager ----
def test_manager_prompt_uses_small_local_ids():
    memories = [(90817, "Andrew has 1 dog", "8 May 2023"), (5, "Andrew lives in Lyon", "9 May 2023")]
    p = build_manager_prompt(["Andrew has 2 dogs"], memories, speaker="Andrew", date_time="10 May 2023")
    assert p.bank_ids == [90817, 5]
    user = p.messages[1]["content"]
    # text first, id second: the id a reply needs follows the memory text it has just copied
    assert '{"text": "Andrew has 1 dog", "id": "0"}' in user and '{"text": "Andrew lives in Lyon", "id": "1"}' in user
    assert "90817" not in user and "Andrew has 2 dogs" in user
    for word in ("ADD", "UPDATE", "DELETE", "NONE", "old_memory"):
        assert word in p.messages[0]["content"]
    with pytest.raises(TypeError, match="facts"):
        build_manager_prompt("not a list", memories)
    with pytest.raises(TypeError, match="memories"):
        build_manager_prompt([], [("x",)])


def test_reply_items_copy_the_fact_then_decide_the_event_then_copy_and_name_the_memory():
    assert list(reply_item("UPDATE", 1, "Andrew has 2 dogs", "Andrew has 1 dog")) == [
        "text", "event", "old_memory", "id"]
    assert list(reply_item("DELETE", 0, "Andrew gave his dog away", "Andrew has 1 dog")) == [
        "text", "event", "old_memory", "id"]
    assert list(reply_item("NONE", 0, old_memory="Andrew has 1 dog")) == ["event", "old_memory", "id"]  # no fact
    assert list(reply_item("ADD", text="Andrew likes tea").items()) == [("text", "Andrew likes tea"), ("event", "ADD")]
    shown = [(7, "Andrew has 1 dog", ""), (9, "Andrew lives in Lyon", "")]
    reply = json.dumps({"memory": [reply_item("UPDATE", 1, "Andrew lives in Paris", shown[1][1]),
                                   reply_item("DELETE", 0, "Andrew gave his dog away", shown[0][1]),
                                   reply_item("ADD", text="Andrew likes tea")]})
    ops, d = parse_manager_output(reply, len(shown))   # the parser reads the example's order
    assert d.status == "ok" and ops == [ManagerOp("UPDATE", 1, "Andrew lives in Paris", "Andrew lives in Lyon"),
                                        ManagerOp("DELETE", 0, "Andrew gave his dog away", "Andrew has 1 dog"),
                                        ManagerOp("ADD", None, "Andrew likes tea")]


def test_manager_parser_cases():
    out = """Sure! Here is the update:
```json
{"memory": [
  {"id": "0", "text": "Andrew has 2 dogs", "event": "UPDATE", "old_memory": "Andrew has 1 dog"},
  {"id": 1, "text": "Andrew lives in Lyon", "event": "none"},
  {"id": "7", "text": "Andrew likes tea", "event": "ADD"},
  {"id": "9", "text": "x", "event": "DELETE"},
  {"id": "0", "text": "", "event": "DELETE"},
  {"id": "1", "text": "Andrew lives in Paris", "event": "UPDATE",},
]}
```"""
    ops, d = parse_manager_output(out, n_shown=2)
    assert ops == [ManagerOp("UPDATE", 0, "Andrew has 2 dogs", "Andrew has 1 dog"),
                   ManagerOp("NONE", 1, "Andrew lives in Lyon"), ManagerOp("ADD", None, "Andrew likes tea")]
    assert d.parsed and d.hallucinated_ids == ["9"] and d.duplicate_ids == 2 and d.status == "hallucinated_id"
    assert d.counts == {"ADD": 1, "UPDATE": 1, "DELETE": 0, "NONE": 1}
    # missing old_memory, NOOP spelling, bare list
    ops, d = parse_manager_output('[{"id": "0", "event": "NOOP"}, {"id": "0", "text": "t", "event": "UPDATE"}]', 1)
    assert [o.event for o in ops] == ["NONE"] and d.duplicate_ids == 1 and d.status == "invalid_item"
    ops, d = parse_manager_output('{"memory": []}', 3)
    assert ops == [] and d.status == "ok"


def test_manager_parse_failure_means_no_ops_and_the_reward_says_why():
    cfg = RewardConfig(format_penalty=0.7, invalid_op_penalty=0.1)
    for bad in ("", "I think we should add it.", '{"memory": "none"}', None, 17, "{{{{"):
        ops, d = parse_manager_output(bad, 3)
        assert ops == [] and not d.parsed and d.status == "parse_error" and d.error
        assert manager_reward([1.0], d.parsed, 0, cfg) == {"em": 1.0, "format": -0.7, "invalid_op": 0.0, "memory": 0.0}
    out = '{"memory": [{"id": "5", "event": "DELETE"}, {"id": "-1", "event": "DELETE"}, {"id": "--1"}, {"id": "²"}]}'
    _, d = parse_manager_output(out, 3)
    assert d.hallucinated_ids == ["5", "-1"] and d.invalid_items == 2   # odd ids never crash the parser
    parts = manager_reward([0.0, 1.0], d.parsed, 4, cfg)
    assert parts == {"em": 0.5, "format": 0.0, "invalid_op": pytest.approx(-0.4), "memory": 0.0}


def test_store_ops_apply_to_a_fork_only():
    emb = CountingEmbedder()
    bank = MemoryBank.create(None, dim=DIM)
    a = bank.apply_batch(store([ManagerOp("ADD", None, "Andrew has 1 dog"),
                                ManagerOp("ADD", None, "Andrew lives in Lyon")], [], emb, "Andrew", "t1"))
    assert emb.calls == 1 and len(bank) == 2
    memories = bank.items_for_prompt()
    prompt = build_manager_prompt(["Andrew has 2 dogs"], memories[::-1])   # local 0 -> bank id a[1]
    out = json.dumps({"memory": [{"id": "1", "text": "Andrew has 2 dogs", "event": "UPDATE"},
                                 {"id": "0", "text": "Andrew lives in Lyon", "event": "DELETE"},
                                 {"id": "2", "text": "Andrew likes tea", "event": "ADD"}]})
    ops, d = parse_manager_output(out, len(prompt.bank_ids))
    store_ops = store(ops, prompt.bank_ids, emb, "Andrew", "t2")
    assert emb.calls == 2 and d.status == "ok"
    child = bank.fork()
    child.apply_batch(store_ops)
    assert sorted(m.text for m in child) == ["Andrew has 2 dogs", "Andrew likes tea"]
    assert child.get(a[0]).timestamp == "t2" and a[1] not in child
    assert len(bank) == 2   # the parent is untouched
    # all-NONE output: no store ops, no embedder call
    assert store([ManagerOp("NONE", 0)], prompt.bank_ids, emb, "Andrew") == [] and emb.calls == 2


def test_oracle_manager_rebuilds_the_final_facts_through_prompts_and_parser():
    """A perfect manager driven by the synthetic oracle, through the real prompt/parse/bank path."""
    emb = HashEmbedder(dim=DIM)
    for conv in synthesize(6, seed=11):
        bank, slot_ids = MemoryBank.create(None, dim=DIM), {}
        for e in conv["memr1_oracle"]["timeline"]:
            shown = bank.items_for_prompt(speaker=e["speaker"])
            prompt = build_manager_prompt([e["fact"]], shown)
            local = {bid: i for i, (bid, _, _) in enumerate(shown)}
            item = {"id": str(len(shown)), "text": e["memory"], "event": e["event"]}
            if e["event"] != "ADD":
                item["id"] = str(local[slot_ids[e["slot"]]])
                item["old_memory"] = e["old_memory"]
            ops, d = parse_manager_output(json.dumps({"memory": [item]}), len(prompt.bank_ids))
            assert d.status == "ok" and len(ops) == 1
            result = bank.apply_batch(store(ops, prompt.bank_ids, emb, e["speaker"], e["date"]))
            if e["event"] == "ADD":
                slot_ids[e["slot"]] = result[0]
            elif e["event"] == "DELETE":
                slot_ids.pop(e["slot"])
        assert {s: bank.get(i).text for s, i in slot_ids.items()} == conv["memr1_oracle"]["final_facts"]
        assert len(bank) == len(slot_ids)


def test_memories_for_facts_merges_without_duplicates():
    emb = HashEmbedder(dim=DIM)
    bank = MemoryBank.create(None, dim=DIM)
    texts = [f"fact number {i}" for i in range(12)]
    bank.apply_batch(store([ManagerOp("ADD", None, t) for t in texts], [], emb, "A"))
    got = memories_for_facts(bank, emb.embed(["fact number 3", "fact number 3", "fact number 7"]), k=5)
    assert len(got) == 5 and len({g[0] for g in got}) == 5
    assert got[0][1] == "fact number 3" and got[1][1] == "fact number 7"


# ---- answer agent ----
def test_answer_prompt_distill_and_direct():
    mems = {"Andrew": [(3, "Andrew has 2 dogs", "8 May 2023")] * 40, "Bea": [("Bea lives in Lyon", "")]}
    msgs = build_answer_messages("How many dogs does Andrew have?", mems)
    user = msgs[1]["content"]
    assert user.count("- [8 May 2023] Andrew has 2 dogs") == 30 and "- Bea lives in Lyon" in user
    assert "Relevant memories" in msgs[0]["content"] and "most recent" in msgs[0]["content"]
    direct = build_answer_messages("Q?", {"A": []}, AnswerConfig(distill=False, top_k_per_speaker=5))
    assert "Relevant memories" not in direct[0]["content"] and "- (none)" in direct[1]["content"]
    with pytest.raises(ValueError, match="question"):
        build_answer_messages("  ", mems)
    with pytest.raises(TypeError, match="memory must be"):
        build_answer_messages("Q?", {"A": [("a", "b", "c", "d")]})


def test_answer_parser():
    r = parse_answer("Relevant memories:\n- [8 May 2023] Andrew has 2 dogs\n- Andrew has 1 dog\n\nAnswer: 2")
    assert r.answer == "2" and r.has_answer_tag
    assert r.selected == ["[8 May 2023] Andrew has 2 dogs", "Andrew has 1 dog"]
    assert parse_answer("**Answer:** \"Lyon\"").answer == "Lyon"
    assert parse_answer("answer: x\nFinal Answer: 7 May 2023").answer == "7 May 2023"
    assert parse_answer("Answer:\nDenver").answer == "Denver"
    r = parse_answer("I think it is\nDenver")
    assert r.answer == "Denver" and not r.has_answer_tag and r.selected == ["I think it is"]
    assert parse_answer("").answer == "" and parse_answer(None).answer == ""
    # Blank-line floods parse in linear time (a quadratic regex took 40 s on 32 KB of newlines), and
    # text past MAX_REPLY_CHARS is read from its tail, where the last "Answer:" line is.
    assert parse_answer("\n" * 200_000 + "Answer: Oslo").answer == "Oslo"
    assert parse_answer("Answer: Rome\n" + "x" * MAX_REPLY_CHARS + "\nAnswer: Oslo").answer == "Oslo"


def test_answer_prompts_embed_each_question_once():
    emb = CountingEmbedder()
    banks = []
    for name in ("A", "B"):
        bank = MemoryBank.create(None, dim=DIM)
        bank.apply_batch(store([ManagerOp("ADD", None, f"{name} fact {i}") for i in range(5)], [], emb, name))
        banks.append(bank)
    emb.calls = 0
    requests = [AnswerRequest(banks[0], "A fact 1?", ("A", "B")), AnswerRequest(banks[1], "B fact 2?", ("B",)),
                AnswerRequest(banks[0], "A fact 1?", ("A",))]
    prompts = answer_prompts(requests, emb, AnswerConfig(top_k_per_speaker=3))
    assert emb.calls == 1 and len(prompts) == 3
    assert len(requests[0].memories["A"]) == 3 and requests[0].memories["B"] == [] and requests[1].shown == 3
    assert isinstance(requests[1].memories["B"][0][0], int) and np.isscalar(requests[1].memories["B"][0][0])
    assert prompts[0] == build_answer_messages("A fact 1?", requests[0].memories, AnswerConfig(top_k_per_speaker=3))
    assert answer_prompts([], emb, AnswerConfig()) == []


def test_answer_prompts_list_memories_in_id_order_so_questions_share_a_prefix():
    """Two questions that retrieve the same memories in a different score order get the same prompt up
    to the question (what the prefix cache reuses); the memories read oldest first."""
    emb = HashEmbedder(DIM)
    bank = MemoryBank.create(None, dim=DIM)
    bank.apply_batch(store([ManagerOp("ADD", None, t) for t in ("likes tea", "owns a red bike", "lives in Oslo")],
                           [], emb, "A"))
    cfg = AnswerConfig(top_k_per_speaker=3)
    requests = [AnswerRequest(bank, q, ("A",)) for q in ("Where does A live, Oslo?", "What does A like, tea?")]
    a, b = (m[1]["content"] for m in answer_prompts(requests, emb, cfg))
    assert [m[0] for m in requests[0].memories["A"]] == sorted(m.id for m in bank)
    assert a.split("Question:")[0] == b.split("Question:")[0] and a != b
    assert a.index("likes tea") < a.index("owns a red bike") < a.index("lives in Oslo")


def test_a_well_formed_reply_fits_its_token_bound():
    from transformers import AutoTokenizer
    from memr1.engine.generation import default_model_path
    tok = AutoTokenizer.from_pretrained(default_model_path())
    for cfg in (AnswerConfig(), AnswerConfig(max_memory_bytes=160), AnswerConfig(max_memory_bytes=20),
                AnswerConfig(distill=False)):
        text = longest_reply_to_fit(cfg)
        assert len(tok.encode(text, add_special_tokens=False)) + 1 <= reply_bound(cfg)
    assert reply_bound(AnswerConfig(distill=False)) < reply_bound(AnswerConfig())
    # Memory text in the prompt is cut to max_memory_bytes (UTF-8, at a character boundary).
    msgs = build_answer_messages("Q?", {"A": [(1, "é" * 100, "8 May 2023")]}, AnswerConfig(max_memory_bytes=21))
    assert "- [8 May 2023] " + "é" * 10 + "\n" in msgs[1]["content"] + "\n"


def test_resolve_text_takes_the_memory_whose_text_the_op_copies():
    """manager.resolve = "text": the shown memory old_memory copies wins over the id; the id breaks ties
    and stands in when the text matches none; "id" (the default) keeps the id."""
    from memr1.rl.task.agents.manager import ManagerConfig
    shown = ["Caroline has two dogs", "Mel lives in Paris", "Mel lives in Paris", "Caroline plays piano"]
    item = lambda i, old, e="UPDATE": {"id": i, "text": "new" if e == "UPDATE" else "", "event": e, "old_memory": old}
    reply = json.dumps({"memory": [item("0", " mel lives in PARIS"),            # conflict: the text names 1 (or 2)
                                   item("2", "Mel lives in Paris", "DELETE"),  # tie: the id is among the matches
                                   item("3", "Caroline plays the piano", "NONE"),   # no match: the id
                                   item("9", "Caroline has two dogs", "NONE")]})  # a bad id the text recovers
    by_id, d_id = parse_manager_output(reply, len(shown), ManagerConfig(), shown)
    by_text, d_text = parse_manager_output(reply, len(shown), ManagerConfig(resolve="text"), shown)
    assert [op.local_id for op in by_id] == [0, 2, 3] and d_id.hallucinated_ids == ["9"]
    assert [op.local_id for op in by_text] == [1, 2, 3, 0] and not d_text.hallucinated_ids
    assert [op.reply_id for op in by_text] == [0, 2, 3, None]   # what the reply said, for the rollout's refs
    assert [op.given_id for op in by_id] == [None] * 3            # "id": nothing moved
