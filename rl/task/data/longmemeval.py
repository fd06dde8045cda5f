"""LongMemEval (Wu et al., 2024) as Conversation/QA structs.

Each LongMemEval item is one question over its own haystack of chat sessions between a user and an
assistant, so each item becomes one Conversation (speakers "User" and "Assistant") holding one QA.
Question types map onto Mem0's categories for the per-category tables: temporal-reasoning -> 2
(temporal), multi-session -> 3 (multi-hop), the single-session types and knowledge-update -> 1
(single-hop); the original type stays in `QA.kind` (with "-abstention" added for `_abs` items).
Evidence is the dia_ids of turns marked `has_answer`. The whole set is an evaluation set: split "test".
"""
from pathlib import Path

from memr1.rl.task.data.locomo import QA, Conversation, DataError, Session, Turn, of_type, read_json

CATEGORY_OF_TYPE = {"single-session-user": 1, "single-session-assistant": 1, "single-session-preference": 1,
                    "knowledge-update": 1, "temporal-reasoning": 2, "multi-session": 3}
SPEAKERS = {"user": "User", "assistant": "Assistant"}


def _field(item: dict, key: str, typ, where: str):
    if key not in item:
        raise DataError(f"{where}: missing key {key!r}")
    if not of_type(item[key], typ):
        raise DataError(f"{where}: {key!r} should be {typ}, got {type(item[key]).__name__}")
    return item[key]


def parse_item(item: dict, where: str, split: str = "test") -> Conversation:
    if not isinstance(item, dict):
        raise DataError(f"{where}: expected an object, got {type(item).__name__}")
    qid = str(_field(item, "question_id", (str, int), where))
    where = f"{where} ({qid})"
    qtype = _field(item, "question_type", str, where)
    if qtype not in CATEGORY_OF_TYPE:
        raise DataError(f"{where}: unknown question_type {qtype!r}")
    raw_sessions = _field(item, "haystack_sessions", list, where)
    dates = _field(item, "haystack_dates", list, where)
    if len(dates) != len(raw_sessions):
        raise DataError(f"{where}: {len(raw_sessions)} haystack_sessions but {len(dates)} haystack_dates")
    sessions, evidence = [], []
    for s_idx, (raw, date) in enumerate(zip(raw_sessions, dates), start=1):
        if not isinstance(raw, list):
            raise DataError(f"{where}: haystack_sessions[{s_idx - 1}] should be a list of turns")
        turns = []
        for t_idx, turn in enumerate(raw, start=1):
            at = f"{where} session {s_idx} turn {t_idx}"
            role = _field(turn, "role", str, at) if isinstance(turn, dict) else None
            if role not in SPEAKERS:
                raise DataError(f"{at}: role should be 'user' or 'assistant', got {role!r}")
            dia_id = f"D{s_idx}:{t_idx}"
            turns.append(Turn(speaker=SPEAKERS[role], dia_id=dia_id,
                              text=str(_field(turn, "content", str, at)), timestamp=str(date)))
            if turn.get("has_answer"):
                evidence.append(dia_id)
        sessions.append(Session(index=s_idx, date_time=str(date), turns=turns))
    kind = qtype + ("-abstention" if qid.endswith("_abs") else "")
    answer = _field(item, "answer", (str, int, float), where)
    qa = QA(question=_field(item, "question", str, where), answer=str(answer),
            evidence=evidence, category=CATEGORY_OF_TYPE[qtype], kind=kind,
            date=str(item.get("question_date", "")))
    return Conversation(sample_id=qid, speaker_a="User", speaker_b="Assistant", sessions=sessions, qa=[qa],
                        split=split)


def load_longmemeval(path, split: str = "test") -> list[Conversation]:
    path = Path(path)
    raw = read_json(path)
    if not isinstance(raw, list):
        raise DataError(f"{path}: expected a JSON list of questions, got {type(raw).__name__}")
    return [parse_item(item, f"{path} item {i}", split) for i, item in enumerate(raw)]
