"""Conversations for training and evaluation, all as `memr1.rl.task.data.locomo.Conversation` structs.

`load_conversations()` is the one entry point: no path gives the built-in synthetic set; a path is read
as LoCoMo, LongMemEval or MSC-Self-Instruct, told apart by the file's contents.
"""
from pathlib import Path

from memr1.rl.task.data.locomo import Conversation, DataError, check_unicode, load_locomo, parse_json

# The key that marks a record of each format.
MARKS = {"locomo": "sample_id", "longmemeval": "question_id", "msc": "self_instruct"}
LAYOUTS = "LoCoMo and LongMemEval files are a JSON list of records, MSC-Self-Instruct one JSON object per line"


def detect_format(path) -> str:
    """"locomo", "longmemeval" or "msc" from the first record of the file; a DataError when it is
    none of them, or more than one."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path}: a directory, not a data file")
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    text = path.read_text(encoding="utf-8", errors="replace")
    head = text.lstrip()[:1]
    if head == "[":
        records = parse_json(text, path)
        if not records:
            raise DataError(f"{path}: expected a non-empty JSON list; this one is empty")
        first = records[0]
    elif head == "{":   # JSON lines: the first line must be a whole record
        line = next(line for line in text.splitlines() if line.strip())
        try:
            first = parse_json(line, path)
        except DataError:
            raise DataError(f"{path}: a JSON object that is not one record per line; {LAYOUTS}") from None
    else:
        raise DataError(f"{path}: not JSON (starts with {text.lstrip()[:10]!r}); {LAYOUTS}")
    kinds = [fmt for fmt, key in MARKS.items() if isinstance(first, dict) and key in first]
    if len(kinds) != 1:
        what = f"could be {' or '.join(kinds)}" if kinds else f"has none of the keys {', '.join(MARKS.values())}"
        raise DataError(f"{path}: cannot tell the format: the first record {what}; {LAYOUTS}")
    if head == "{" and kinds[0] != "msc":
        raise DataError(f"{path}: {kinds[0]} records must be in a JSON list, not one object per line")
    return kinds[0]


SYNTHETIC_KINDS = ("synthetic", "budget")   # synthetic.py's set, budget.py's budgeted task


def synthesize(n: int, seed: int, kind: str = "synthetic") -> list[dict]:
    """A built-in set as LoCoMo-format dicts: `kind` names its generator (SYNTHETIC_KINDS)."""
    if kind == "budget":
        from memr1.rl.task.data.budget import synthesize_budget
        return synthesize_budget(n, seed)
    if kind != "synthetic":
        raise ValueError(f"synthetic data kind must be one of {', '.join(SYNTHETIC_KINDS)}, got {kind!r}")
    from memr1.rl.task.data.synthetic import synthesize as default_set
    return default_set(n, seed)


def load_configured(data, split: str | None = None) -> list[Conversation]:
    """`load_conversations` for a run's `[data]` section (its path, n, seed and kind)."""
    return load_conversations(data.path or None, data.n, data.seed, split=split, kind=data.kind)


def load_conversations(path=None, n: int = 20, seed: int = 0, split: str | None = None,
                       kind: str = "synthetic") -> list[Conversation]:
    """The built-in set of `kind` (n, seed) when `path` is None, else the file's; optionally one split."""
    if path is None:
        from memr1.rl.task.data.locomo import parse_locomo
        convs = parse_locomo(synthesize(n, seed, kind), source=f"{kind}(n={n}, seed={seed})")
    else:
        fmt = detect_format(path)
        if fmt == "locomo":
            convs = load_locomo(path)
        elif fmt == "longmemeval":
            from memr1.rl.task.data.longmemeval import load_longmemeval
            convs = load_longmemeval(path)
        else:
            from memr1.rl.task.data.msc import load_msc
            convs = load_msc(path)
        for c in convs:
            check_unicode(c, path)
    return [c for c in convs if split is None or c.split == split]
