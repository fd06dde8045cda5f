"""Model output never crashes a parser: 10,000+ seeded random and malformed completions, each
classified, plus well-formed ones whose classification is checked exactly, and a Hypothesis pass."""
import json
import random
import re
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from memr1.memory_store import HashEmbedder, MemoryBank
from memr1.rl.task.agents.answer import parse_answer
from memr1.rl.task.agents.extract import parse_facts
from memr1.rl.task.agents.manager import EVENTS, ManagerConfig, ManagerOp, parse_manager_output, to_store_ops
from memr1.rl.task.eval.judging import parse_judge

N_CASES = 10_000
N_SHOWN = 4
CFG = ManagerConfig()
EVENT_SPELLINGS = ["ADD", "UPDATE", "DELETE", "NONE", "add", "Noop", "NO-OP", "remove", "MERGE", "", None, 3]
ID_VALUES = ["0", "1", "3", 2, "4", "17", -1, "-1", "abc", None, 1.0, 2.5, True, "999999999999", [], {"x": 1},
             "--1", "\u00b2", "\u2460", "9" * 5000]
JUNK = ["{", "}", "[", "]", '"', "'", ",", ":", "\\", "\n", "```", "null", "\u201c", "\u00e9", "\x00", "{{", "]]]"]


def random_item(rng: random.Random):
    if rng.random() < 0.05:
        return rng.choice(["text", 5, None, ["nested"]])
    item = {}
    if rng.random() < 0.95:
        item["event"] = rng.choice(EVENT_SPELLINGS)
    if rng.random() < 0.9:
        item["id"] = rng.choice(ID_VALUES)
    if rng.random() < 0.9:
        item["text"] = rng.choice(["Andrew has 2 dogs", "", "  ", "Bea lives in Lyon", 42, "x" * 900])
    if rng.random() < 0.4:
        item["old_memory"] = rng.choice(["Andrew has 1 dog", None, 7])
    return item


def expected(items: list) -> tuple[list[tuple], str]:
    """What a correct parser returns for a well-formed {"memory": items}: ops and status."""
    aliases = {"NOOP": "NONE", "NO-OP": "NONE", "REMOVE": "DELETE"}
    ops, used, halluc, invalid = [], set(), False, False
    for item in items:
        if not isinstance(item, dict):
            invalid = True
            continue
        event = str(item.get("event", "")).strip().upper()
        event = aliases.get(event, event)
        text = item.get("text", "")
        text = text.strip() if isinstance(text, str) else ""
        if event not in EVENTS or (event in ("ADD", "UPDATE") and not text):
            invalid = True
            continue
        if event == "ADD":
            ops.append((event, None))
            continue
        raw = item.get("id")
        local = None
        if isinstance(raw, str) and re.fullmatch(r"-?[0-9]+", raw.strip()) and len(raw.strip()) < 10:
            raw = int(raw)   # ASCII digits only; "--1", "\u00b2" and 5,000-digit ids name nothing shown
        if isinstance(raw, float) and raw.is_integer():
            raw = int(raw)
        if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < N_SHOWN:
            local = raw
        if local is None:
            halluc = True
        elif local in used:
            invalid = True
        else:
            used.add(local)
            ops.append((event, local))
    status = "hallucinated_id" if halluc else "invalid_item" if invalid else "ok"
    return ops, status


def corrupt(rng: random.Random, text: str) -> str:
    kind = rng.randrange(9)
    if kind == 0:
        return text[: rng.randrange(len(text) + 1)]                          # truncated
    if kind == 1:
        i = rng.randrange(len(text) + 1)
        return text[:i] + rng.choice(JUNK) + text[i:]                        # stray character
    if kind == 2 and text:
        i = rng.randrange(len(text))
        return text[:i] + text[i + 1:]                                       # dropped character
    if kind == 3:
        return f"Here is my answer:\n```json\n{text}\n```\nHope that helps!"  # fenced with prose
    if kind == 4:
        return text.replace("}", "},").replace("]", ",]")                    # trailing commas
    if kind == 5:
        return text.replace('"', "'")                                        # single quotes
    if kind == 6:
        return "".join(rng.choice(JUNK + ["a", " ", "memory", "event"]) for _ in range(rng.randint(0, 60)))
    if kind == 7:
        return "[" * rng.randint(1, 3000) + text                             # deep nesting
    return text.replace("memory", rng.choice(["memories", "mem", "operations"]))


def check_manager(output, bank, bank_ids, checked_apply: list) -> str:
    ops, d = parse_manager_output(output, N_SHOWN, CFG)
    assert d.status in ("ok", "parse_error", "hallucinated_id", "invalid_item")
    if not d.parsed:
        assert ops == [] and d.error
    assert sum(d.counts.values()) == len(ops)
    locals_ = [op.local_id for op in ops if op.event != "ADD"]
    assert len(set(locals_)) == len(locals_) and all(0 <= i < N_SHOWN for i in locals_)
    assert all(op.text for op in ops if op.event in ("ADD", "UPDATE"))
    if ops and len(checked_apply) < 1500:   # whatever parses must also apply cleanly to a real bank
        texts = [op.text for op in ops if op.event in ("ADD", "UPDATE")]
        bank.fork().apply_batch(to_store_ops(ops, bank_ids, EMB.embed(texts) if texts else [], "Andrew", "t"))
        checked_apply.append(1)
    return d.status


def check_others(output):
    a = parse_answer(output)
    assert isinstance(a.answer, str) and isinstance(a.selected, list)
    f = parse_facts(output)
    assert all(isinstance(x, str) and x for x in f.facts)
    assert parse_judge(output) in ("CORRECT", "WRONG", None)


EMB = HashEmbedder(dim=16)


@pytest.fixture(scope="module")
def bank():
    """A bank holding the N_SHOWN memories the fuzzed completions refer to by local id."""
    b = MemoryBank.create(None, dim=16)
    ids = b.apply_batch(to_store_ops([ManagerOp("ADD", None, f"memory {i}") for i in range(N_SHOWN)], [],
                                     EMB.embed([f"memory {i}" for i in range(N_SHOWN)]), "Andrew"))
    return b, ids


def test_manager_parser_fuzz_10k(bank):
    rng = random.Random(20260)
    statuses, applied, exact = Counter(), [], 0
    for case in range(N_CASES):
        items = [random_item(rng) for _ in range(rng.randint(0, 6))]
        text = json.dumps({"memory": items})
        if rng.random() < 0.3:   # well-formed: the classification must be exactly right
            ops, d = parse_manager_output(text, N_SHOWN, CFG)
            want_ops, want_status = expected(items)
            assert [(o.event, o.local_id) for o in ops] == want_ops, (items, ops)
            assert d.status == want_status, (items, d)
            exact += 1
        else:
            text = corrupt(rng, text)
        statuses[check_manager(text, *bank, applied)] += 1
        check_others(text)   # the answer, fact and judge parsers see the same 10,000 strings
    assert sum(statuses.values()) == N_CASES and exact > 2500 and len(applied) >= 1000
    assert all(statuses[s] > 200 for s in ("ok", "parse_error", "hallucinated_id", "invalid_item")), statuses


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=400) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_parsers_never_raise_on_arbitrary_text(bank, text):
    check_manager(text, *bank, [])
    check_others(text)


# Megabyte inputs of the shapes that made regexes quadratic (long runs of newlines, braces, brackets,
# quotes, repeated prefixes), and adversarial families (fences: unclosed, with a tag, thousands of them;
# bullets; a long run of one character after a prefix, alone, before an "Answer:" line and after one):
# each parser stays linear. A linear parser takes milliseconds on each; a quadratic one takes seconds on
# the first 32,000 characters alone and minutes on a megabyte. So the bound is a generous one on that
# linear-time property, in process CPU time with the garbage collector off, so that neither a busy
# machine nor a collection of the suite's heap during a parse can fail it.
MB = 1 << 20
HUGE = {"newlines": "\n" * MB, "braces": "{" * MB, "brackets": "[" * MB, "quotes": '"' * MB,
        "answer-tags": "Answer:" * 150_000,
        "many-ops": '{"memory": [' + '{"id": "1", "event": "UPDATE", "text": "x"}, ' * 25_000,
        "dashes": "- " * (MB // 2), "letters": "a" * MB}
PREFIXES = ["```", "```json\n", "- x", "1. x", "* ", "Answer:", "Relevant memories:\n", "{", '{"memory": ["', "'"]
RUNS = [" ", "\n", "\t", "a", "1", "`", "{", '"', "\u3000"]
FENCES_AND_BULLETS = {"fences": "```" * (MB // 3), "tagged-fences": "```json\n{```" * (MB // 12),
                      "fence-then-text": "```" + "x" * MB + "```", "bullets": "- x\n" * (MB // 4),
                      "bullet-spaces": "- x" + " " * MB + "y", "numbered-tabs": "1. x" + "\t" * MB + "y"}
PARSERS = {"manager": lambda t: parse_manager_output(t, N_SHOWN, CFG), "answer": parse_answer,
           "facts": parse_facts, "judge": parse_judge}


def check_parse_times(texts, bound: float = 2.0) -> None:
    """Fails at the first parse of any of `texts` over `bound` seconds."""
    import gc
    import time
    gc.collect()
    gc.disable()
    try:
        for label, text in texts:
            assert len(text) >= 1_000_000, label
            for name, parse in PARSERS.items():
                t0 = time.process_time()
                parse(text)
                seconds = time.process_time() - t0
                assert seconds < bound, f"{name} on {label}: {seconds:.2f} s"
    finally:
        gc.enable()


@pytest.mark.parametrize("label", HUGE)
def test_a_megabyte_of_model_text_parses_in_linear_time(label):
    check_parse_times([(label, HUGE[label])])


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_megabyte_run_after_a_prefix_parses_in_linear_time(prefix):
    check_parse_times((f"{prefix!r} + {ch!r} * 1 MB {where}", text) for ch in RUNS for where, text in (
        ("", prefix + ch * MB), ("+ answer line", prefix + ch * MB + "y\nAnswer: x"),
        ("after an answer line", "Answer: x\n" + prefix + ch * MB + "y")))


def test_megabyte_fences_and_bullets_parse_in_linear_time():
    check_parse_times(FENCES_AND_BULLETS.items())


_OLD_FENCE = re.compile(r"```[a-zA-Z0-9_-]*\s*\n?(.*?)```", re.S)   # the regex _fenced replaces (quadratic)
_OLD_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+(.+?)\s*$")


def test_fence_and_bullet_scanners_agree_with_the_regexes_they_replace():
    from memr1.rl.task.agents.extract import _BULLET
    from memr1.rl.task.agents.jsonish import MAX_FENCES, _fenced
    rng = random.Random(35)
    alphabet = ["`", "``", "```", "```", "json", "\n", " ", "\t", "{", "}", "x", "-", "*", "1", ".", ")", "\u2022"]
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        old_bodies = [m.group(1) for m in _OLD_FENCE.finditer(text) if m.group(1).strip()]
        assert _fenced(text) == old_bodies[:MAX_FENCES], repr(text)
        for line in text.splitlines():
            old, new = _OLD_BULLET.match(line), _BULLET.match(line)
            # A bullet with only spaces after it gave a blank fact, which every caller drops.
            assert (new.group(1).rstrip() if new else "") == (old.group(1).strip() if old else ""), repr(line)
