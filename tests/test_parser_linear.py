"""The agent parsers do work linear in the reply: no ast.literal_eval per span, bullets de-duplicated by
a set. What they return is the same as the parser they replace (kept below as `_old_extract_json`) on
representative replies, each truncated at every length."""
import ast
import json
import re
import time
import warnings

import pytest

from memr1.rl.task.agents import jsonish
from memr1.rl.task.agents.extract import ExtractConfig, _clean, parse_facts
from memr1.rl.task.agents.jsonish import extract_json
from memr1.rl.task.agents.manager import parse_manager_output

# ---- the extract_json these parsers had before (per-span ast.literal_eval, a restarted scan per start)
_OLD_TRAILING_COMMA = re.compile(r",\s*([}\]])")


def _old_balanced_spans(text, opener):
    closer = {"{": "}", "[": "]"}
    start, tries = text.find(opener), 0
    while start != -1 and tries < jsonish.MAX_STARTS:
        tries += 1
        stack, in_str, esc, quote = [], False, False, ""
        end = None
        for i in range(start, len(text)):
            ch = text[i]
            if in_str:
                if esc:
                    esc = False
                elif ch == "\\":
                    esc = True
                elif ch == quote:
                    in_str = False
            elif ch in "\"'" and (ch == '"' or not stack or text[i - 1] in "[{:, "):
                in_str, quote = True, ch
            elif ch in "{[":
                stack.append(closer[ch])
            elif ch in "}]":
                if not stack or stack[-1] != ch:
                    break
                stack.pop()
                if not stack:
                    end = i + 1
                    break
        if end is not None:
            yield text[start:end]
        elif stack and not in_str:
            yield text[start:].rstrip().rstrip(",") + "".join(reversed(stack))
        start = text.find(opener, start + 1)


def _old_loads(candidate):
    for attempt in (candidate, _OLD_TRAILING_COMMA.sub(r"\1", candidate)):
        try:
            return json.loads(attempt), None
        except Exception as e:
            err = f"{type(e).__name__}: {e}"
    try:
        if len(candidate) < 20_000:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return ast.literal_eval(_OLD_TRAILING_COMMA.sub(r"\1", candidate)), None
    except Exception:
        pass
    return None, err


def _old_extract_json(text, want=(dict, list)):
    if not isinstance(text, str):
        return None, f"output is {type(text).__name__}, not str"
    text = text[:jsonish.MAX_CHARS].translate(jsonish._SMART_QUOTES)
    if not text.strip():
        return None, "empty output"
    candidates = jsonish._fenced(text) + [text]
    openers = ("{", "[") if want == (dict, list) else (("{",) if want is dict else ("[",))
    last_err = "no JSON object found"
    for chunk in candidates:
        whole, err = _old_loads(chunk.strip())
        if isinstance(whole, want):
            return whole, None
        for opener in openers:
            for span in _old_balanced_spans(chunk, opener):
                value, err = _old_loads(span)
                if isinstance(value, want):
                    return value, None
                last_err = err or f"found {type(value).__name__}, wanted {want}"
    return None, last_err


# ---- representative replies: JSON, Python literals, fences, prose, escapes, sets and tuples
REPLIES = [
    '{"facts": ["Anna has 2 cats", "Anna moved to Lyon on 7 May 2023"]}',
    '```json\n{"facts": ["Tom has a sister named Lily"]}\n```',
    'Here are the facts:\n```\n{"facts": ["Sara started a pottery class",]}\n```\nHope that helps!',
    "{'facts': ['Anna has 2 cats', 'Anna\\'s cat is named Tom']}",
    "Sure! {'facts': [\"Bea's dog\", 'say \"hi\"'], 'done': True, 'extra': None}",
    "[{'fact': 'Anna likes tea'}, {'text': 'Anna \\u00e9t\\u00e9 \\x41 \\N{BULLET}'}]",
    '{"memory": [{"text": "Anna has 3 cats", "event": "UPDATE", "old_memory": "Anna has 2 cats", "id": "0"},'
    ' {"text": "Anna moved", "event": "ADD"}, {"event": "NONE", "old_memory": "x", "id": "1"}]}',
    "{'memory': [{'text': 'Anna has 3 cats', 'event': 'UPDATE', 'old_memory': 'Anna has 2 cats', 'id': 0},"
    " {'text': 'Anna moved', 'event': 'ADD', 'id': None}]}",
    'I think {the answer} is: {"memory": [{"text": "Bea lives in Lyon", "event": "ADD"}]}',
    "Notes: {Anna's} list [1, 2,] then {'facts': ('a', 'b'), 'n': 2., 'set': {'x', 'y'}}",
    '{"memory": [{"event": "DELETE", "id": 2}, {"event": "NONE", "id": (1)}], "note": "tab\there"}',
    '- Anna has 2 cats\n- Anna has 2 cats\n2. Bea lives in Lyon\n* \u2022 odd bullet',
    '{"verdict": "CORRECT", "why": "it\'s right"}',
    "{'a': true, 'b': null}",
    '{"facts": ["\u201csmart quotes\u201d", "it\u2019s"]}',
    "[1, # a comment\n 2]",
    "{'facts': ['\\ud83d\\ude00', 'a\\\nb', '\\777', '\\d']}",
]


@pytest.mark.parametrize("reply", REPLIES)
def test_extract_json_returns_what_it_did_on_representative_replies_and_their_prefixes(reply):
    """Every prefix of each reply too: completions are cut at the token budget anywhere."""
    for cut in range(len(reply) + 1):
        text = reply[:cut]
        for want in ((dict, list), dict, list):
            old, new = _old_extract_json(text, want), extract_json(text, want)
            assert new[0] == old[0] and type(new[0]) is type(old[0]), (text, want, old, new)
            assert (new[1] is None) == (old[1] is None), (text, want)
        assert parse_facts(text) == _old_parse_facts(text), text


def _old_parse_facts(output):
    """parse_facts with the old extract_json and the old list de-duplication."""
    from memr1.rl.task.agents.extract import _BULLET, ExtractResult
    cfg = ExtractConfig()

    def clean(items):
        out = []
        for item in items:
            if isinstance(item, dict):
                text = item.get("fact", item.get("text"))
                item = text if text is not None else "; ".join(
                    f"{k}: {v}" for k, v in item.items() if isinstance(v, (str, int, float)) and str(v).strip())
            if isinstance(item, str) and item.strip() and item.strip() not in out:
                out.append(item.strip()[: cfg.max_fact_chars])
        return out[: cfg.max_facts]

    value, err = _old_extract_json(output)
    if isinstance(value, dict):
        items = value.get("facts", value.get("memory"))
        if isinstance(items, list):
            return ExtractResult(clean(items), parsed=True)
        err = "JSON object has no 'facts' list"
    elif isinstance(value, list):
        return ExtractResult(clean(value), parsed=True)
    lines = output[:jsonish.MAX_CHARS].splitlines() if isinstance(output, str) else []
    bullets = [m.group(1).rstrip() for line in lines if (m := _BULLET.match(line))]
    return ExtractResult(clean(bullets), parsed=False, error=err or "no JSON found")


def test_span_scan_agrees_with_the_scan_it_replaces():
    import random
    rng = random.Random(67)
    alphabet = ["{", "}", "[", "]", '"', "'", "\\", ",", ":", " ", "a", "\n", "'a'", '"b"', "1", "{'", "[\""]
    for _ in range(30_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        for opener in "{[":
            assert list(jsonish._balanced_spans(text, opener)) == list(_old_balanced_spans(text, opener)), text


def test_truncated_object_closing_into_a_set_still_parses_as_before():
    """{"memory": [..., {"text" cut there closes into a set, which only Python can read."""
    reply = '{"memory": [{"text": "Anna has 3 cats", "event": "ADD"}, {"text"'
    ops, diag = parse_manager_output(reply, 2)
    assert diag.parsed and [o.text for o in ops] == ["Anna has 3 cats"] and diag.invalid_items == 1


# ---- hostile replies: the work is linear in their length
def _hostile(n: int) -> dict[str, str]:
    """Replies of about n characters built to make a parser try many long spans."""
    fence = max(n // 9 - 8, 8)
    return {
        "fenced-python-spans": ("```\n" + "['a', " * (fence // 6) + "\n```\n") * 8 + "{'x': [" * (n // 90),
        "fenced-token-spans": ("```\n" + "['a' 'b' " * (fence // 9) + "\n```\n") * 8,
        "unclosed-python": "{'a': [" * (n // 7),
        "string-parity": '["\\u00e9\\n ' * (n // 11),
        "set-in-fence": "```\n{" + "'a', " * (n // 5) + "\n```",
        "brackets": "[" * n,
    }


class _Work:
    """Counts the characters the parsers hand to ast.literal_eval and to the Python-literal rewrite."""

    def __init__(self, monkeypatch):
        self.ast_calls = self.ast_chars = self.rewritten = 0
        real_eval, real_rewrite = ast.literal_eval, getattr(jsonish, "_python_to_json", None)

        def literal_eval(s):
            self.ast_calls += 1
            self.ast_chars += len(s)
            return real_eval(s)

        def rewrite(s):
            self.rewritten += len(s)
            return real_rewrite(s)
        monkeypatch.setattr(ast, "literal_eval", literal_eval)
        monkeypatch.setattr(jsonish, "_python_to_json", rewrite, raising=False)


@pytest.mark.parametrize("label", list(_hostile(1000)))
def test_hostile_replies_cost_work_linear_in_their_length(label, monkeypatch):
    work = _Work(monkeypatch)
    for n in (4_000, 8_000, 16_000, 30_000):
        text = _hostile(n)[label]
        for parse in (extract_json, parse_facts, lambda t: parse_manager_output(t, 4)):
            work.ast_calls = work.ast_chars = work.rewritten = 0
            parse(text)
            # The per-span ast.literal_eval gave up to ~10 times the reply's length to ast, per parse.
            assert work.ast_chars <= 2 * len(text) + 1000, (label, n, work.ast_chars)
            assert work.rewritten <= 4 * len(text) + 1000, (label, n, work.rewritten)


def test_a_30k_hostile_reply_parses_fast():
    """A generous bound (the budget is 0.1 s at the 32k cap; a linear parse takes a few hundredths)."""
    import gc
    gc.collect()
    gc.disable()
    try:
        for label, text in _hostile(30_000).items():
            t0 = time.process_time()
            parse_facts(text)
            parse_manager_output(text, 4)
            assert time.process_time() - t0 < 0.5, label
    finally:
        gc.enable()


def test_bullets_are_deduplicated_in_linear_time():
    """20,000 distinct facts: a list's `in` makes 2e8 comparisons (seconds); a set, milliseconds."""
    items = [f"fact {i}" for i in range(20_000)] + ["fact 7", " fact 8 "]
    t0 = time.process_time()
    out = _clean(items, ExtractConfig(max_facts=10_000))
    assert time.process_time() - t0 < 1.0
    assert out == [f"fact {i}" for i in range(10_000)]
    long = "x" * 400   # a fact cut to max_fact_chars still drops a later copy of its cut form, as before
    assert _clean([long, "x" * 300, long + "y"], ExtractConfig(max_fact_chars=300)) == ["x" * 300, "x" * 300]
