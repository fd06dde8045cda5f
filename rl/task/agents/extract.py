"""Fact extraction: one dialogue turn (speaker, date) -> a list of short third-person facts.

It runs before the Memory Manager. The prompt asks for JSON `{"facts": [...]}` and shows four worked
turns first (two of them with nothing to note), as Mem0's extraction prompt does: a 135M base model
given only instructions rambles past any token budget on most real turns, and with the examples it
answers in the JSON shape. The parser also takes a bare list or, failing JSON, bullet / numbered lines,
and never raises on model output. `grounded` drops facts that share no content word with the turn,
names aside (a small model invents a new baby for a greeting).
"""
import hashlib
import json
import re
from typing import Annotated

import msgspec
from msgspec import Meta

from memr1.rl.task.agents.jsonish import MAX_CHARS, extract_json

EXTRACT_SYSTEM = """You take notes about the people in a conversation so they can be remembered later.
Read ONE message and list the lasting personal facts it states about the speaker or people they
mention: family, home, work, pets, hobbies, likes, plans, and events with their dates.

Rules:
- One short fact per item, in the third person with the person's name ("Anna has 2 cats").
- Turn relative dates into absolute ones using the message date ("yesterday" on 8 May 2023 -> "on 7 May 2023").
- Greetings, questions, small talk and compliments hold no facts: return an empty list.

Reply with JSON only: {"facts": ["...", "..."]}"""

# Worked turns shown before the real one (invented people; none from any data set).
EXAMPLES = (
    ("3:10 pm on 14 March, 2022", "Tom", "Hi Sara! Long time no see, how are you doing?", []),
    ("3:12 pm on 14 March, 2022", "Sara",
     "Good! I just adopted a puppy named Biscuit last week, and I started a pottery class.",
     ["Sara adopted a puppy named Biscuit in the week before 14 March 2022", "Sara started a pottery class"]),
    ("3:15 pm on 14 March, 2022", "Tom", "That's awesome, what breed is he?", []),
    ("3:16 pm on 14 March, 2022", "Tom", "My sister Lily moved to Denver for her nursing job.",
     ["Tom has a sister named Lily", "Tom's sister Lily moved to Denver for a nursing job"]),
)

# Names the prompt in extraction cache keys: editing the prompt or the examples invalidates old facts.
PROMPT_ID = hashlib.sha256(json.dumps([EXTRACT_SYSTEM, EXAMPLES]).encode()).hexdigest()[:12]


class ExtractConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    source: str = "model"      # model: the base model extracts each turn's facts; oracle: the synthetic
                               # timeline's facts (a perfect extractor; synthetic data only)
    max_new_tokens: Annotated[int, Meta(ge=1, le=65_536)] = 512  # the completion budget of each extraction call
    context_turns: Annotated[int, Meta(ge=0, le=1000)] = 0     # preceding turns shown for references; a 135M
                               # extractor writes fewer grounded facts with them (it restates the context)
    max_facts: Annotated[int, Meta(ge=1, le=10_000)] = 8         # a runaway completion cannot flood the manager
    max_fact_chars: Annotated[int, Meta(ge=1, le=100_000)] = 300
    grounded: bool = True      # keep only facts sharing a content word with the turn (names aside)

    def __post_init__(self):
        if self.source not in ("model", "oracle"):
            raise ValueError(f"extract.source must be model or oracle, got {self.source!r}")


def build_extract_messages(speaker: str, text: str, date_time: str = "",
                           context: list[tuple[str, str]] | None = None) -> list[dict]:
    """Chat messages for one turn: the instructions, the worked examples, then the turn. `context`
    holds a few preceding (speaker, text) pairs to resolve references; only the last message's facts
    are asked for."""
    for name, value in (("speaker", speaker), ("text", text), ("date_time", date_time)):
        if not isinstance(value, str):
            raise TypeError(f"build_extract_messages: {name} must be str, got {type(value).__name__}")
    msgs = [{"role": "system", "content": EXTRACT_SYSTEM}]
    for when, who, said, facts in EXAMPLES:
        msgs += [{"role": "user", "content": f"Message date: {when}\n{who}: {said}"},
                 {"role": "assistant", "content": json.dumps({"facts": facts})}]
    lines = []
    if context:
        lines.append("Earlier messages (for context only):")
        lines += [f"{s}: {t}" for s, t in context]
        lines.append("")
    lines.append(f"Message date: {date_time or 'unknown'}")
    lines.append(f"{speaker}: {text}")
    msgs.append({"role": "user", "content": "\n".join(lines)})
    return msgs


_WORD = re.compile(r"[a-z0-9]+")
_FILLER = frozenset("""a an the and or but so to of in on at for with from by about as is am are was were be been
has have had do does did i me my you your he him his she her they them their we our it its this that these those
not no yes just really very too also new some any all one there here what who how when where why""".split())


def content_words(text: str, names: set[str] = frozenset()) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _FILLER and w not in names}


def grounded(facts: list[str], text: str, names: list[str]) -> list[str]:
    """The facts that share a content word with `text` (the turn, and its context when shown); the
    conversation's speaker `names` and filler words do not count."""
    skip = {w for name in names for w in _WORD.findall(name.lower())}
    said = content_words(text, skip)
    return [f for f in facts if content_words(f, skip) & said]


class ExtractResult(msgspec.Struct):
    facts: list[str]
    parsed: bool          # True when the output held JSON of the expected shape
    error: str = ""       # why JSON parsing failed (the facts may still come from the line fallback)


# A fact starts at a non-space character: with a lazy `(.+?)\s*$` instead, a long run of spaces inside a
# line is rescanned at every extension (quadratic).
_BULLET = re.compile(r"\s*(?:[-*\u2022]|\d+[.)])\s+(\S.*)")


def _clean(items, cfg: ExtractConfig) -> list[str]:
    out, seen = [], set()   # a set: a list's `in` made thousands of distinct bullets quadratic
    for item in items:
        if isinstance(item, dict):   # {"fact": "..."} or {"text": "..."} objects are common
            text = item.get("fact", item.get("text"))
            # Small models also write attribute objects ({"name": .., "location": ..}): keep their values.
            item = text if text is not None else "; ".join(
                f"{k}: {v}" for k, v in item.items() if isinstance(v, (str, int, float)) and str(v).strip())
        if isinstance(item, str) and (fact := item.strip()) and fact not in seen:
            out.append(fact[: cfg.max_fact_chars])
            seen.add(out[-1])
    return out[: cfg.max_facts]


def parse_facts(output, cfg: ExtractConfig = ExtractConfig()) -> ExtractResult:
    """Facts from a completion; never raises."""
    value, err = extract_json(output)
    if isinstance(value, dict):
        items = value.get("facts", value.get("memory"))
        if isinstance(items, list):
            return ExtractResult(_clean(items, cfg), parsed=True)
        err = "JSON object has no 'facts' list"
    elif isinstance(value, list):
        return ExtractResult(_clean(value, cfg), parsed=True)
    lines = output[:MAX_CHARS].splitlines() if isinstance(output, str) else []   # the JSON parse's cut
    bullets = [m.group(1).rstrip() for line in lines if (m := _BULLET.match(line))]
    return ExtractResult(_clean(bullets, cfg), parsed=False, error=err or "no JSON found")
