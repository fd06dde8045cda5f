"""Tolerant JSON extraction from model output, shared by every agent parser.

Small models wrap JSON in code fences, put prose around it, leave trailing commas, use single quotes or
Python literals, or stop mid-object. `extract_json` tries a few cheap repairs in order and returns
`(value, error)`; it never raises, whatever the text (the trainer feeds it every sampled completion).
Its work is linear in the text: a bracket scan serves every start it passes, Python literals are
rewritten as JSON, and ast.literal_eval sees a bounded number of characters per reply.
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


_CLOSER = {"{": "}", "[": "]"}
_SPECIAL = re.compile(r"""["'{}\[\]]""")   # the only characters that change a span scan's state
# The rest of a string after its opening quote (any escaped character included); None when unclosed.
_STRING_REST = {q: re.compile(rf"(?:[^{q}\\]|\\.)*+{q}", re.S) for q in "\"'"}


class _Scan:
    """One string-aware bracket scan from an opener, with what every opener it passed outside a string
    needs to be answered without scanning again: where it closes, or, left open, its depth. A scan from a
    later opener that this one passed outside a string sees the same strings and the same brackets above
    its own depth, so its span follows from this scan (one pass over bracket-heavy text, not one each)."""

    def __init__(self, text: str, start: int):
        self.closes, self.depth, opened, closers = {}, {}, [], []
        self.in_str, skip = False, start
        for m in _SPECIAL.finditer(text, start):
            i = m.start()
            if i < skip:   # inside a string already passed
                continue
            ch = m.group()
            if ch in "{[":
                self.depth[i] = len(opened)
                opened.append(i)
                closers.append(_CLOSER[ch])
            elif ch in "}]":
                if closers[-1] != ch:   # a mismatched closer ends the scan, the span left open
                    break
                closers.pop()
                self.closes[opened.pop()] = i + 1
                if not opened:
                    break
            elif ch == '"' or text[i - 1] in "[{:, ":   # a single quote opens a string only where a value
                rest = _STRING_REST[ch].match(text, i + 1)  # starts ("Anna's" is prose)
                if rest is None:
                    self.in_str = True
                    break
                skip = rest.end()
        self.closers = closers   # of the brackets left open, outermost first

    def span(self, text: str, start: int) -> str | None:
        """The span from the opener at `start` (one this scan passed): closed where it closes; else, when
        the text does not end inside a string, the rest of the text closed by the brackets left open."""
        if start in self.closes:
            return text[start:self.closes[start]]
        if self.in_str:
            return None
        return text[start:].rstrip().rstrip(",") + "".join(reversed(self.closers[self.depth[start]:]))


def _balanced_spans(text: str, opener: str):
    """Yield substrings that start at each of the first MAX_STARTS `opener`s and end at its matching
    bracket (string-aware). An unclosed span at the end is yielded closed, so a truncated completion can
    still parse."""
    start, tries, scans = text.find(opener), 0, []
    while start != -1 and tries < MAX_STARTS:
        tries += 1
        scan = next((s for s in scans if start in s.depth), None)
        if scan is None:   # an opener no scan passed outside a string: inside one, or after the last
            scan = _Scan(text, start)
            scans.append(scan)
        span = scan.span(text, start)
        if span is not None:
            yield span
        start = text.find(opener, start + 1)


# Python literals ({'a': True}) are read by rewriting them as JSON: linear, and in C but for one call per
# string. ast.literal_eval, ~100 times json's cost per character, is left for what JSON cannot write (a
# set, as a truncated {"memory": [{"text"} closes into; a tuple; 2.; a comment), only on text made of a
# literal's tokens, and within a budget per reply, so a reply of many failing spans stays linear.
# A rewrite gives ast.literal_eval's value or fails: JSON's own words are names to Python, and a
# surrogate pair stays two characters (written unescaped, so json does not join them).
_PY_TOKEN = re.compile(r"""'((?:[^'\\\r\n]|\\.)*+)('?)|"((?:[^"\\\r\n]|\\.)*+)("?)"""
                       r"|\b(True|False|None|true|false|null|NaN|Infinity)\b", re.S)
_PY_ESCAPE = re.compile(r"\\(?:x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|N\{[^}\r\n]*\}|[0-7]{1,3}|.)", re.S)
_CONTROL = re.compile(r"[\x00-\x09\x0b\x0c\x0e-\x1f]")   # valid in a Python string, not in a JSON one
_PY_WORDS = {"True": "true", "False": "false", "None": "null"}   # any other word: not a literal
_PY_DEPTH = 200       # brackets Python nests at most ("too many nested parentheses")
# Every token a literal may hold (a superset: ast decides); prose, names and operators fail it.
_PY_LITERAL = re.compile("(?:" + "|".join((
    r"[\s\[\](){},:+-]", r"\\\n", r"#[^\n]*",
    r"[rRbBuU]{0,2}(?:'''(?:[^'\\]|\\.|'(?!''))*+'''" + r'|"""(?:[^"\\]|\\.|"(?!""))*+"""'
    + r"""|'(?:[^'\\\n]|\\.)*+'|"(?:[^"\\\n]|\\.)*+")""",
    r"True\b", r"False\b", r"None\b", r"\.?[0-9][0-9a-zA-Z_.]*")) + ")*+", re.S)
# Characters each reply may rewrite, and give to ast, per character of its own and beyond. A literal is
# tried as the whole text, as its fence, and as the span found in its prose, closed when truncated.
PY_BUDGET, AST_BUDGET, BUDGET_SLACK = 4, 2, 1000


class _NotALiteral(Exception):
    pass


def _py_unescape(m) -> str:
    seq = m.group()
    if not seq.isascii():   # an unknown escape of a non-ASCII character stays as written, as in Python
        return seq
    try:
        return seq.encode().decode("unicode_escape")   # Python's own escapes: \x41, \N{...}, octal, ...
    except UnicodeDecodeError:
        raise _NotALiteral from None


def _py_token(m) -> str:
    if m.group(5):
        if m.group(5) not in _PY_WORDS:
            raise _NotALiteral
        return _PY_WORDS[m.group(5)]
    body, closed = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(3), m.group(4))
    if not closed:
        raise _NotALiteral
    return json.dumps(_PY_ESCAPE.sub(_py_unescape, body) if "\\" in body else body, ensure_ascii=False)


def _python_to_json(candidate: str) -> str | None:
    """`candidate` with its Python strings and True / False / None written as JSON; None when it cannot
    be a literal (an unclosed string, a bad escape, a JSON word, a NUL)."""
    if "\0" in candidate:   # Python refuses source holding one
        return None
    try:
        with warnings.catch_warnings():   # odd escapes in model text warn; they are not our bug
            warnings.simplefilter("ignore")
            return _PY_TOKEN.sub(_py_token, candidate)
    except _NotALiteral:
        return None


def _nests_within(value, limit: int = _PY_DEPTH) -> bool:
    """Whether `value` nests at most `limit` containers deep (Python refuses deeper literals)."""
    level, deepest = [value], 1
    while level:
        level = [v for c in level for v in (c.values() if isinstance(c, dict) else c) if isinstance(v, (dict, list))]
        deepest += bool(level)
        if deepest > limit:
            return False
    return True


def _maybe_python(text: str) -> bool:
    """False when rewriting `text` as JSON would leave its value unchanged (json has failed on it)."""
    return ("'" in text or "\\" in text or "True" in text or "False" in text or "None" in text
            or _CONTROL.search(text) is not None)


def _loads(candidate: str, budget: dict[str, int]):
    """json.loads, then the same after removing trailing commas, then as a Python literal. `budget`
    holds the characters this reply may still rewrite ("rewrite") or give to ast ("ast")."""
    stripped = _TRAILING_COMMA.sub(r"\1", candidate)
    for attempt in (candidate, stripped):
        try:
            return json.loads(attempt), None
        except Exception as e:   # RecursionError and friends too: model output never crashes us
            err = f"{type(e).__name__}: {e}"
    if len(candidate) >= 20_000:
        return None, err
    if len(stripped) <= budget["rewrite"] and _maybe_python(stripped):
        budget["rewrite"] -= len(stripped)
        converted = _python_to_json(stripped)
        if converted is not None:
            try:
                value = json.loads(converted)
                if _PY_DEPTH >= converted.count("[") + converted.count("{") or _nests_within(value):
                    return value, None
            except Exception:
                pass
    if len(stripped) <= budget["ast"] and _PY_LITERAL.fullmatch(stripped):
        budget["ast"] -= len(stripped)
        try:
            with warnings.catch_warnings():   # odd escapes in model text warn; they are not our bug
                warnings.simplefilter("ignore")
                return ast.literal_eval(stripped), None
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
    budget = {"rewrite": PY_BUDGET * len(text) + BUDGET_SLACK, "ast": AST_BUDGET * len(text) + BUDGET_SLACK}
    for chunk in candidates:
        whole, err = _loads(chunk.strip(), budget)
        if isinstance(whole, want):
            return whole, None
        for opener in openers:
            for span in _balanced_spans(chunk, opener):
                value, err = _loads(span, budget)
                if isinstance(value, want):
                    return value, None
                last_err = err or f"found {type(value).__name__}, wanted {want}"
    return None, last_err
