"""LoCoMo conversations as typed structs, the Memory-R1 split, and `memr1 data stats`.

The same loader reads our synthetic set (`synthetic.py` writes LoCoMo's JSON layout plus a few
`memr1_*` keys). Choices made here:
- An image turn keeps its text and gets " [image: <blip_caption>]" appended, so a caption-only fact
  ("a photo of a sunset over a lake") can still be extracted.
- Integer answers become strings; category 5 (adversarial) is dropped at load time.
- Only sessions that exist are read (some conversations list more date keys than sessions).
- Category names follow Mem0's mapping (1 single-hop, 2 temporal, 3 multi-hop, 4 open-domain).
"""
import json
import re
import sys
from pathlib import Path

import msgspec

from memr1.rl.task.data.errors import DataError
from memr1.rl.task.data.oracle import check_oracle

CATEGORY_NAMES = {1: "single-hop", 2: "temporal", 3: "multi-hop", 4: "open-domain"}
SPLITS = ("train", "val", "test")
# Memory-R1's split of locomo10: one conversation to train, one to validate, the other eight to test.
MEMORY_R1_SPLIT = {"conv-26": "train", "conv-30": "val"}


class Turn(msgspec.Struct, frozen=True):
    speaker: str
    dia_id: str
    text: str
    timestamp: str = ""   # the session's date_time, carried so every memory can be dated


class Session(msgspec.Struct, frozen=True):
    index: int
    date_time: str
    turns: list[Turn]


class QA(msgspec.Struct, frozen=True):
    question: str
    answer: str
    evidence: list[str]
    category: int
    kind: str = ""        # the source's own question type where it has one (LongMemEval, MSC)
    date: str = ""        # when the question is asked, where the source says (LongMemEval)


class Conversation(msgspec.Struct, frozen=True):
    sample_id: str
    speaker_a: str
    speaker_b: str
    sessions: list[Session]
    qa: list[QA]
    split: str = "test"
    oracle: dict | None = None   # synthetic data only: the fact timeline and oracle manager ops

    def turns(self) -> list[Turn]:
        return [t for s in self.sessions for t in s.turns]


def check_unicode(conv: Conversation, source) -> None:
    """Every string of `conv` encodes as UTF-8. JSON can spell a lone surrogate ("\\ud800"), which
    would fail only later, in the memory bank or a cache file's name."""
    strings = [("sample_id", conv.sample_id), ("speaker_a", conv.speaker_a), ("speaker_b", conv.speaker_b)]
    for s in conv.sessions:
        strings.append((f"session_{s.index}_date_time", s.date_time))
        strings += [(f"turn {i} of session_{s.index}: {key}", getattr(t, key))
                    for i, t in enumerate(s.turns) for key in ("speaker", "dia_id", "text")]
    for i, q in enumerate(conv.qa):
        strings += [(f"qa {i}: {key}", value) for key, value in
                    (("question", q.question), ("answer", q.answer), ("kind", q.kind), ("date", q.date))]
        strings += [(f"qa {i}: evidence", e) for e in q.evidence]
    for what, value in strings:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise DataError(f"{source}: conversation {ascii(conv.sample_id)}: {what} is not valid Unicode "
                            f"(a lone surrogate)") from None


def split_of(sample_id: str) -> str:
    return MEMORY_R1_SPLIT.get(sample_id, "test")


def of_type(value, typ) -> bool:
    """isinstance, except that true/false are not numbers (JSON's `true` is no category 1)."""
    types = typ if isinstance(typ, tuple) else (typ,)
    return isinstance(value, typ) and (bool in types or not isinstance(value, bool))


def _need(obj: dict, key: str, typ, where: str):
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected an object, got {type(obj).__name__}")
    if key not in obj:
        raise DataError(f"{where}: missing key {key!r}")
    if not of_type(obj[key], typ):
        raise DataError(f"{where}: {key!r} should be {typ}, got {type(obj[key]).__name__}")
    return obj[key]


def _session_numbers(conv: dict, where: str) -> list[int]:
    numbers = []
    for k, v in conv.items():
        if m := re.fullmatch(r"session_(\d+)", k):
            # the turns are looked up again as f"session_{n}": only the canonical spelling finds them
            if not re.fullmatch(r"[1-9][0-9]{0,8}|0", m.group(1), re.ASCII):
                raise DataError(f"{where}: session key {k[:60]!r} is not session_<N> with N in ASCII digits "
                                f"without leading zeros")
            if not isinstance(v, list):   # a session in another shape would otherwise vanish unnoticed
                raise DataError(f"{where}: {k} should be a list of turns, got {type(v).__name__}")
            numbers.append(int(m.group(1)))
    return sorted(numbers)


def parse_turn(raw: dict, timestamp: str, where: str) -> Turn:
    speaker = _need(raw, "speaker", str, where)
    dia_id = _need(raw, "dia_id", str, where)
    # Memories record their turn ids (evidence recall), which the bank bounds. Imported here: the GPU
    # learner path imports this package's configs and must not load the native bank.
    from memr1.memory_store.schema import MAX_SOURCE_BYTES
    try:
        size = len(dia_id.encode("utf-8"))
    except UnicodeError:
        raise DataError(f"{where}: 'dia_id' is not valid Unicode") from None
    if not 1 <= size <= MAX_SOURCE_BYTES:
        raise DataError(f"{where}: 'dia_id' should be 1 to {MAX_SOURCE_BYTES} bytes, got {size}")
    text = raw.get("text", "")
    if not isinstance(text, str):
        raise DataError(f"{where}: 'text' should be a string")
    caption = raw.get("blip_caption")
    if isinstance(caption, str) and caption:
        text = f"{text} [image: {caption}]".strip()
    return Turn(speaker=speaker, dia_id=dia_id, text=text, timestamp=timestamp)


def parse_qa(raw: dict, where: str) -> QA | None:
    category = _need(raw, "category", int, where)
    if category == 5:
        return None
    if category not in CATEGORY_NAMES:
        raise DataError(f"{where}: unknown category {category}")
    question = _need(raw, "question", str, where)
    answer = _need(raw, "answer", (str, int, float), where)
    evidence = raw.get("evidence", [])
    if not isinstance(evidence, list):
        raise DataError(f"{where}: 'evidence' should be a list")
    return QA(question=question, answer=str(answer), evidence=[str(e) for e in evidence],
              category=category, kind=str(raw.get("memr1_kind", "")))


def parse_conversation(raw: dict, where: str = "conversation") -> Conversation:
    sample_id = _need(raw, "sample_id", str, where)
    where = f"{where} {sample_id}"
    conv = _need(raw, "conversation", dict, where)
    sessions = []
    for n in _session_numbers(conv, where):
        date_time = conv.get(f"session_{n}_date_time", "")
        if not isinstance(date_time, str):
            raise DataError(f"{where}: session_{n}_date_time should be a string")
        turns = [parse_turn(t, date_time, f"{where} session_{n} turn {i}")
                 for i, t in enumerate(conv[f"session_{n}"])]
        sessions.append(Session(index=n, date_time=date_time, turns=turns))
    if not sessions:
        raise DataError(f"{where}: no session_<N> lists in 'conversation'")
    qa = [q for i, r in enumerate(_need(raw, "qa", list, where))
          if (q := parse_qa(r, f"{where} qa {i}")) is not None]
    split = raw.get("memr1_split", split_of(sample_id))
    if split not in SPLITS:
        raise DataError(f"{where}: memr1_split {split!r} is not one of {SPLITS}")
    oracle = check_oracle(raw.get("memr1_oracle"), {t.dia_id for s in sessions for t in s.turns}, where)
    return Conversation(sample_id=sample_id, speaker_a=_need(conv, "speaker_a", str, where),
                        speaker_b=_need(conv, "speaker_b", str, where), sessions=sessions, qa=qa,
                        split=split, oracle=oracle)


def parse_locomo(raw, source: str = "<memory>") -> list[Conversation]:
    if not isinstance(raw, list):
        raise DataError(f"{source}: expected a JSON list of conversations, got {type(raw).__name__}")
    convs = [parse_conversation(c, f"{source} item {i}") for i, c in enumerate(raw)]
    seen = set()
    for c in convs:
        if c.sample_id in seen:
            raise DataError(f"{source}: duplicate sample_id {c.sample_id!r}")
        seen.add(c.sample_id)
    return convs


def read_json(path) -> object:
    """A data file's JSON, or a DataError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    return parse_json(path.read_bytes(), path)


def parse_json(data: bytes | str, source) -> object:
    """JSON text -> a value, or a DataError naming `source` (also for nesting too deep to parse)."""
    try:
        return json.loads(data)
    except ValueError as e:   # JSONDecodeError, UnicodeDecodeError, an integer of 5,000 digits
        raise DataError(f"{source}: not valid JSON ({e})") from None
    except RecursionError:
        raise DataError(f"{source}: not valid JSON (nested too deeply)") from None


def load_locomo(path) -> list[Conversation]:
    return parse_locomo(read_json(path), str(path))


def by_split(convs: list[Conversation]) -> dict[str, list[Conversation]]:
    out = {s: [] for s in SPLITS}
    for c in convs:
        out[c.split].append(c)
    return out


def stats(convs: list[Conversation]) -> dict:
    """Counts per split, as `memr1 data stats --json` prints them."""
    splits = {}
    for name, group in by_split(convs).items():
        qa = [q for c in group for q in c.qa]
        splits[name] = {
            "conversations": len(group),
            "sessions": sum(len(c.sessions) for c in group),
            "turns": sum(len(s.turns) for c in group for s in c.sessions),
            "qa": len(qa),
            "by_category": {CATEGORY_NAMES[k]: sum(q.category == k for q in qa) for k in CATEGORY_NAMES},
            "by_category_number": {str(k): sum(q.category == k for q in qa) for k in CATEGORY_NAMES},
        }
    return {"category_mapping": "mem0", "splits": splits}


def stats_cli(args) -> int:
    """`memr1 data stats PATH [--json]`."""
    try:
        result = stats(load_locomo(args.path))
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    cats = "  ".join(f"{k}:{v}" for k, v in CATEGORY_NAMES.items())
    print(f"{args.path}  (categories, Mem0 mapping: {cats})")
    print(f"{'split':<6} {'convs':>5} {'sess':>5} {'turns':>6} {'qa':>5}  " +
          " ".join(f"{v:>12}" for v in CATEGORY_NAMES.values()))
    for name, s in result["splits"].items():
        print(f"{name:<6} {s['conversations']:>5} {s['sessions']:>5} {s['turns']:>6} {s['qa']:>5}  " +
              " ".join(f"{s['by_category'][v]:>12}" for v in CATEGORY_NAMES.values()))
    return 0
