"""Answer Agent: prompt with the question and each speaker's top-k memories (with timestamps), and a
parser for "selected memories, then `Answer: ...`" (Memory-R1's memory distillation).

Prompts are plain functions of (question, memories), so eval can build them for many conversations
and send one batched `generate` call. `retrieve_for_questions` does the retrieval side with ONE
embedder call for all questions.
"""
import re

import msgspec

DISTILL_SYSTEM = """You answer questions about two people using memories taken from their past
conversations. Each memory has the date of the conversation it came from.

First, under "Relevant memories:", copy the few memories that help answer the question (one per line).
Then give your final answer on the last line as "Answer: <answer>".

Rules for the answer:
- At most 5 or 6 words: just the fact asked for, no full sentence.
- If memories disagree, trust the most recent one.
- Turn relative dates ("yesterday", "last week") into absolute dates using the memory's date.
- If the memories do not say, give your best short guess."""

DIRECT_SYSTEM = """You answer questions about two people using memories taken from their past
conversations. Each memory has the date of the conversation it came from.

Reply with one line, "Answer: <answer>", in at most 5 or 6 words. If memories disagree, trust the most
recent one, and turn relative dates into absolute dates using the memory's date."""


class AnswerConfig(msgspec.Struct, frozen=True):
    top_k_per_speaker: int = 30   # Memory-R1: 30 per speaker, 60 in all
    distill: bool = True          # False: answer directly without selecting memories (ablation)
    max_answer_chars: int = 200


def _memory_lines(memories: list[tuple]) -> list[str]:
    """(id, text, timestamp) or (text, timestamp) tuples -> "- [timestamp] text" lines."""
    lines = []
    for m in memories:
        if len(m) == 3:
            _, text, ts = m
        elif len(m) == 2:
            text, ts = m
        else:
            raise TypeError(f"a memory must be (id, text, timestamp) or (text, timestamp), got {m!r}")
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
        lines = _memory_lines(list(memories)[: cfg.top_k_per_speaker]) or ["- (none)"]
        parts.append(f"Memories of {speaker}:\n" + "\n".join(lines))
    parts.append(f"Question: {question.strip()}")
    system = DISTILL_SYSTEM if cfg.distill else DIRECT_SYSTEM
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


class AnswerResult(msgspec.Struct):
    answer: str
    selected: list[str]
    has_answer_tag: bool   # False: no "Answer:" line, the answer is the last non-empty line


_ANSWER = re.compile(r"(?im)^[\s*#>_-]*(?:final\s+)?answer\s*[:\uff1a]\s*(.*)$")
_SELECTED_HEADER = re.compile(r"(?i)^\s*[*#]*\s*(relevant|selected)\s+memor(y|ies)")
_STRIP = " \t*_`\"'"


def parse_answer(output, cfg: AnswerConfig = AnswerConfig()) -> AnswerResult:
    """Selected memories and the answer; never raises. The LAST "Answer:" line wins (models sometimes
    restate the question format first)."""
    if not isinstance(output, str):
        return AnswerResult(answer="", selected=[], has_answer_tag=False)
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


def retrieve_for_questions(requests: list[tuple], embedder, k: int) -> list[dict[str, list[tuple]]]:
    """Memories for many questions at once. Each request is (bank, question, speakers); the result is
    one {speaker: [(id, text, timestamp), ...]} per request, top-k per speaker by similarity."""
    if not requests:
        return []
    vectors = embedder.embed([q for _, q, _ in requests])
    return [{s: bank.items_for_prompt(vector=v, k=k, speaker=s) for s in speakers}
            for (bank, _, speakers), v in zip(requests, vectors)]
