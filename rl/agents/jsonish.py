"""Tolerant JSON extraction from model output, shared by every agent parser.

Small models wrap JSON in code fences, put prose around it, leave trailing commas, use single quotes or
Python literals, or stop mid-object. `extract_json` tries a few cheap repairs in order and returns
`(value, error)`; it never raises, whatever the text (the trainer feeds it every sampled completion).
"""
import ast
import json
import re
import warnings

_FENCE_TAG = re.compile(r"[a-zA-Z0-9_-]*\s*")   # "json\n" after the opening fence
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_SMART_QUOTES = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})
MAX_CHARS = 32_000    # longer completions are cut: parsing must stay cheap inside the rollout loop
MAX_STARTS = 8        # bracket positions tried per opener; bounds the work on bracket-heavy junk
MAX_FENCES = 8        # code fences tried before the whole text; bounds the work on backtick runs


def _fenced(text: str) -> list[str]:
    """The bodies of the first MAX_FENCES non-blank ``` fences in `text`, language tag left out. Found
    with str.find: a regex with a lazy body backtracks over the whole rest of the text at every tag
    length (quadratic on an unclosed fence)."""
    bodies, start = [], text.find("```")
    while start != -1 and len(bodies) < MAX_FENCES:
        end = text.find("```", start + 3)
        if end == -1:
            break
        body = text[start + 3:end]
        body = body[_FENCE_TAG.match(body).end():]
        if body.strip():
            bodies.append(body)
        start = text.find("```", end + 3)
    return bodies


def _balanced_spans(text: str, opener: str):
    """Yield substrings that start at each `opener` and end at its matching bracket (string-aware).
    An unclosed span at the end is yielded closed, so a truncated completion can still parse."""
    closer = {"{": "}", "[": "]"}
    start, tries = text.find(opener), 0
    while start != -1 and tries < MAX_STARTS:
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


def _loads(candidate: str):
    """json.loads, then the same after removing trailing commas, then a Python literal."""
    for attempt in (candidate, _TRAILING_COMMA.sub(r"\1", candidate)):
        try:
            return json.loads(attempt), None
        except Exception as e:   # RecursionError and friends too: model output never crashes us
            err = f"{type(e).__name__}: {e}"
    try:
        if len(candidate) < 20_000:
            with warnings.catch_warnings():   # odd escapes in model text warn; they are not our bug
                warnings.simplefilter("ignore")
                return ast.literal_eval(_TRAILING_COMMA.sub(r"\1", candidate)), None
    except Exception:
        pass
    return None, err


def extract_json(text, want: type | tuple = (dict, list)):
    """Find the first JSON value of type `want` in `text`. Returns (value, None) or (None, error)."""
    if not isinstance(text, str):
        return None, f"output is {type(text).__name__}, not str"
    text = text[:MAX_CHARS].translate(_SMART_QUOTES)
    if not text.strip():
        return None, "empty output"
    candidates = _fenced(text) + [text]
    openers = ("{", "[") if want == (dict, list) else (("{",) if want is dict else ("[",))
    last_err = "no JSON object found"
    for chunk in candidates:
        whole, err = _loads(chunk.strip())
        if isinstance(whole, want):
            return whole, None
        for opener in openers:
            for span in _balanced_spans(chunk, opener):
                value, err = _loads(span)
                if isinstance(value, want):
                    return value, None
                last_err = err or f"found {type(value).__name__}, wanted {want}"
    return None, last_err
