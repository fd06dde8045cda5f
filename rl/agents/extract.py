"""Fact extraction: one dialogue turn (speaker, date) -> a list of short third-person facts.

It runs before the Memory Manager. The prompt asks for JSON `{"facts": [...]}`; the parser also takes
a bare list or, failing JSON, bullet / numbered lines, and never raises on model output.
"""
import re
from typing import Annotated

import msgspec
from msgspec import Meta

from memr1.rl.agents.jsonish import MAX_CHARS, extract_json

EXTRACT_SYSTEM = """You take notes about the people in a conversation so they can be remembered later.
Read ONE message and write down the lasting personal facts it reveals about the speaker or people they
mention: who they are, where they live, work, family, pets, hobbies, likes and dislikes, plans, and
events with their dates.

Rules:
- One short fact per item, written in the third person with the person's name ("Anna has 2 cats").
- Turn relative dates into absolute ones using the message date ("yesterday" on 8 May 2023 -> "on 7 May 2023").
- Leave out greetings, small talk, opinions about the other speaker, and anything uncertain.
- If there is nothing worth remembering, return an empty list.

Reply with JSON only: {"facts": ["...", "..."]}"""


class ExtractConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    source: str = "model"      # model: the base model extracts each turn's facts; oracle: the synthetic
                               # timeline's facts (a perfect extractor; synthetic data only)
    max_new_tokens: Annotated[int, Meta(ge=1, le=65_536)] = 512  # the completion budget of each extraction call
    context_turns: Annotated[int, Meta(ge=0, le=1000)] = 2     # preceding turns shown for references
    max_facts: Annotated[int, Meta(ge=1, le=10_000)] = 8         # a runaway completion cannot flood the manager
    max_fact_chars: Annotated[int, Meta(ge=1, le=100_000)] = 300

    def __post_init__(self):
        if self.source not in ("model", "oracle"):
            raise ValueError(f"extract.source must be model or oracle, got {self.source!r}")


def build_extract_messages(speaker: str, text: str, date_time: str = "",
                           context: list[tuple[str, str]] | None = None) -> list[dict]:
    """Chat messages for one turn. `context` holds a few preceding (speaker, text) pairs to resolve
    pronouns and references; only facts from the last message are asked for."""
    for name, value in (("speaker", speaker), ("text", text), ("date_time", date_time)):
        if not isinstance(value, str):
            raise TypeError(f"build_extract_messages: {name} must be str, got {type(value).__name__}")
    lines = []
    if context:
        lines.append("Earlier messages (for context only):")
        lines += [f"{s}: {t}" for s, t in context]
        lines.append("")
    lines.append(f"Message date: {date_time or 'unknown'}")
    lines.append(f"{speaker}: {text}")
    return [{"role": "system", "content": EXTRACT_SYSTEM}, {"role": "user", "content": "\n".join(lines)}]


class ExtractResult(msgspec.Struct):
    facts: list[str]
    parsed: bool          # True when the output held JSON of the expected shape
    error: str = ""       # why JSON parsing failed (the facts may still come from the line fallback)


# A fact starts at a non-space character: with a lazy `(.+?)\s*$` instead, a long run of spaces inside a
# line is rescanned at every extension (quadratic).
_BULLET = re.compile(r"\s*(?:[-*\u2022]|\d+[.)])\s+(\S.*)")


def _clean(items, cfg: ExtractConfig) -> list[str]:
    out = []
    for item in items:
        if isinstance(item, dict):   # {"fact": "..."} or {"text": "..."} objects are common
            text = item.get("fact", item.get("text"))
            # Small models also write attribute objects ({"name": .., "location": ..}): keep their values.
            item = text if text is not None else "; ".join(
                f"{k}: {v}" for k, v in item.items() if isinstance(v, (str, int, float)) and str(v).strip())
        if isinstance(item, str) and item.strip() and item.strip() not in out:
            out.append(item.strip()[: cfg.max_fact_chars])
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
