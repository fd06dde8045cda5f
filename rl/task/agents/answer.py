"""Answer Agent: prompt with the question and each speaker's top-k memories (with timestamps), and a
parser for "selected memories, then `Answer: ...`" (Memory-R1's memory distillation).

Prompts are plain functions of (question, memories); retrieval is `rl.task.turns.answer_prompts`, which
training and evaluation share.
"""
import re

from typing import Annotated

import msgspec
from msgspec import Meta

DISTILL_SYSTEM = """You answer questions about two people from memories of their past conversations; each
memory has the date of the conversation it came from. First, under "Relevant memories:", copy the few
memories that answer the question, one per line. Then write the final answer on the last line as
"Answer: <answer>", in at most 5 or 6 words: just the fact asked for. If memories disagree, trust the
most recent one. Turn relative dates ("yesterday", "last week") into absolute dates using the memory's
date. If no memory answers the question (it was never said, or is no longer true), the answer is
"none"."""

DIRECT_SYSTEM = """You answer questions about two people using memories taken from their past
conversations. Each memory has the date of the conversation it came from.

Reply with one line, "Answer: <answer>", in at most 5 or 6 words. If memories disagree, trust the most
recent one, and turn relative dates into absolute dates using the memory's date. If no memory answers
the question, reply "Answer: none"."""


class AnswerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The answer agent's task settings, the same in training rollouts, as stage 1's frozen answerer
    and in evaluation."""
    top_k_per_speaker: Annotated[int, Meta(ge=1, le=1000)] = 30   # Memory-R1: 30 per speaker, 60 in all
    distill: bool = True          # False: answer directly without selecting memories (ablation)
    max_new_tokens: Annotated[int, Meta(ge=1, le=65_536)] = 2048   # the completion budget of every answer call (the paper's cap)
    max_memory_bytes: Annotated[int, Meta(ge=1, le=1 << 24)] = 512   # a memory's text is cut to this many UTF-8 bytes in the prompt, so
                                  # copying one memory has a known token bound (reply_bound)
    max_answer_chars: Annotated[int, Meta(ge=1, le=100_000)] = 200


TIMESTAMP_BYTES = 40      # a memory's timestamp is cut to this many bytes in the prompt
SHORT_ANSWER_BYTES = 64   # "at most 5 or 6 words", with room to spare


def _cut(text: str, limit: int) -> str:
    """`text` cut to at most `limit` UTF-8 bytes, at a character boundary."""
    raw = text.encode("utf-8")
    return text if len(raw) <= limit else raw[:limit].decode("utf-8", errors="ignore")


def longest_reply_to_fit(cfg: AnswerConfig) -> str:
    """The longest reply a budget must never cut: with distillation, one copied memory and a short
    answer; without it, the short answer alone."""
    answer = f"Answer: {'9' * SHORT_ANSWER_BYTES}"
    if not cfg.distill:
        return answer
    return f"Relevant memories:\n- [{'9' * TIMESTAMP_BYTES}] {'9' * cfg.max_memory_bytes}\n{answer}"


def reply_bound(cfg: AnswerConfig) -> int:
    """Tokens that reply can take, for any byte-level tokenizer: at most one token per UTF-8 byte, plus
    a few for the end-of-turn tokens. A budget below it can cut a well-formed answer."""
    return len(longest_reply_to_fit(cfg).encode("utf-8")) + 8


def memory_lines(memories: list[tuple], cfg: AnswerConfig) -> list[str]:
    """(id, text, timestamp) or (text, timestamp) tuples -> "- [timestamp] text" lines."""
    lines = []
    for m in memories:
        if len(m) == 3:
            _, text, ts = m
        elif len(m) == 2:
            text, ts = m
        else:
            raise TypeError(f"a memory must be (id, text, timestamp) or (text, timestamp), got {m!r}")
        text, ts = _cut(str(text), cfg.max_memory_bytes), _cut(str(ts or ""), TIMESTAMP_BYTES)
        lines.append(f"- [{ts}] {text}" if ts else f"- {text}")
    return lines


def build_answer_messages(question: str, memories_by_speaker: dict[str, list[tuple]],
                          cfg: AnswerConfig = AnswerConfig()) -> list[dict]:
    if not isinstance(question, str) or not question.strip():
        raise ValueError("build_answer_messages: question must be a non-empty string")
    if not isinstance(memories_by_speaker, dict):
        raise TypeError("build_answer_messages: memories_by_speaker must be a dict speaker -> memories")
    parts = []
    for speaker, memories in memories_by_speaker.items():
        lines = memory_lines(list(memories)[: cfg.top_k_per_speaker], cfg) or ["- (none)"]
        parts.append(f"Memories of {speaker}:\n" + "\n".join(lines))
    parts.append(f"Question: {question.strip()}")
    system = DISTILL_SYSTEM if cfg.distill else DIRECT_SYSTEM
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


class AnswerResult(msgspec.Struct):
    answer: str
    selected: list[str]
    has_answer_tag: bool   # False: no "Answer:" line, the answer is the last non-empty line


# The line prefix excludes newlines: with \s there, every line start would rescan all later blank lines
# (quadratic in the reply's length).
_ANSWER = re.compile(r"(?im)^[ \t*#>_-]*(?:final[ \t]+)?answer[ \t]*[:\uff1a][ \t]*(.*)$")
MAX_REPLY_CHARS = 32_000   # longer model text is parsed from its tail, where the last "Answer:" is
# One class for the markup before the header: `\s*[*#]*\s*` splits a run of spaces between the two
# `\s*` in every way (quadratic).
_SELECTED_HEADER = re.compile(r"(?i)[\s*#]*(relevant|selected)\s+memor(y|ies)")
_STRIP = " \t*_`\"'"


def parse_answer(output, cfg: AnswerConfig = AnswerConfig()) -> AnswerResult:
    """Selected memories and the answer; never raises. The LAST "Answer:" line wins (models sometimes
    restate the question format first)."""
    if not isinstance(output, str):
        return AnswerResult(answer="", selected=[], has_answer_tag=False)
    output = output[-MAX_REPLY_CHARS:]
    matches = list(_ANSWER.finditer(output))
    if matches:
        m = matches[-1]
        answer, body, tagged = m.group(1), output[: m.start()], True
        if not answer.strip():   # "Answer:" alone on a line, the answer on the next
            rest = [ln for ln in output[m.end():].splitlines() if ln.strip()]
            answer = rest[0] if rest else ""
    else:
        lines = [ln for ln in output.splitlines() if ln.strip()]
        answer, body, tagged = (lines[-1] if lines else ""), "\n".join(lines[:-1]), False
    selected = []
    for line in body.splitlines():
        if not line.strip() or _SELECTED_HEADER.match(line):
            continue
        item = re.sub(r"^\s*(?:[-*\u2022]|\d+[.)])\s*", "", line).strip()
        if item:
            selected.append(item)
    return AnswerResult(answer=answer.strip(_STRIP)[: cfg.max_answer_chars].strip(), selected=selected,
                        has_answer_tag=tagged)
