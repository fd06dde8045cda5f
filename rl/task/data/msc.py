"""MemGPT's MSC-Self-Instruct (deep memory retrieval) as Conversation/QA structs.

One JSON object per line (a JSON list is accepted too). Each holds `previous_dialogs` (sessions, each
with `dialog`: [{"id": speaker, "text"}] and the gap `time_num` `time_unit`), optionally the current
`dialog`, and `self_instruct` with the probing question in "B" and its answer in "A". Each row becomes
one Conversation with one QA (category 1, kind "msc-self-instruct"), split "test".
MSC gives no calendar dates, so a session's `date_time` states its position and recorded gap.
"""
from pathlib import Path

from memr1.rl.task.data.locomo import QA, Conversation, DataError, Session, Turn, parse_json

SPEAKERS = ("Speaker 1", "Speaker 2")


def _session(raw, index: int, where: str) -> Session:
    if isinstance(raw, dict):
        dialog, gap = raw.get("dialog"), (raw.get("time_num"), raw.get("time_unit"))
    else:
        dialog, gap = raw, (None, None)
    if not isinstance(dialog, list):
        raise DataError(f"{where}: session {index} has no 'dialog' list")
    date_time = f"session {index}" + (f" ({gap[0]} {gap[1]} gap)" if gap[0] is not None and gap[1] else "")
    turns = []
    for t_idx, turn in enumerate(dialog, start=1):
        if not isinstance(turn, dict) or not isinstance(turn.get("text"), str):
            raise DataError(f"{where}: session {index} turn {t_idx} needs a string 'text'")
        speaker = str(turn.get("id") or SPEAKERS[(t_idx - 1) % 2])
        turns.append(Turn(speaker=speaker, dia_id=f"D{index}:{t_idx}", text=turn["text"], timestamp=date_time))
    return Session(index=index, date_time=date_time, turns=turns)


def parse_row(row: dict, index: int, where: str) -> Conversation:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object, got {type(row).__name__}")
    previous = row.get("previous_dialogs")
    if not isinstance(previous, list):
        raise DataError(f"{where}: missing 'previous_dialogs' list")
    current = row.get("dialog")
    raw_sessions = list(previous) + ([current] if isinstance(current, list) and current else [])
    sessions = [_session(s, i, where) for i, s in enumerate(raw_sessions, start=1)]
    probe = row.get("self_instruct")
    if not isinstance(probe, dict) or not isinstance(probe.get("B"), str) or "A" not in probe:
        raise DataError(f"{where}: 'self_instruct' needs a question in 'B' and an answer in 'A'")
    qa = QA(question=probe["B"], answer=str(probe["A"]), evidence=[], category=1, kind="msc-self-instruct")
    return Conversation(sample_id=f"msc-{index}", speaker_a=SPEAKERS[0], speaker_b=SPEAKERS[1],
                        sessions=sessions, qa=[qa], split="test")


def load_msc(path) -> list[Conversation]:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    text = path.read_text(encoding="utf-8", errors="replace")
    if text.lstrip().startswith("["):
        rows = list(enumerate(parse_json(text, path), start=1))
    else:
        rows = [(n, parse_json(line, f"{path} line {n}"))
                for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    return [parse_row(row, k, f"{path} row {line}") for k, (line, row) in enumerate(rows)]
