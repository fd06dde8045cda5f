"""Conversations for training and evaluation, all as `memr1.rl.data.locomo.Conversation` structs.

`load_conversations()` is the one entry point: no path gives the built-in synthetic set; a path is read
as LoCoMo, LongMemEval or MSC-Self-Instruct, told apart by the file's contents.
"""
import json
from pathlib import Path

from memr1.rl.data.locomo import Conversation, DataError, load_locomo


def detect_format(path) -> str:
    """"locomo", "longmemeval" or "msc" from the first record of the file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    with path.open("rb") as f:
        head = f.read(1).lstrip() or b""
    if path.suffix == ".jsonl" or head == b"{":
        return "msc"
    try:
        first = json.loads(path.read_bytes())[0]
    except (ValueError, IndexError, KeyError, TypeError) as e:
        raise DataError(f"{path}: expected a non-empty JSON list ({type(e).__name__}: {e})") from None
    if isinstance(first, dict) and "sample_id" in first:
        return "locomo"
    if isinstance(first, dict) and "question_id" in first:
        return "longmemeval"
    if isinstance(first, dict) and "self_instruct" in first:
        return "msc"
    raise DataError(f"{path}: cannot tell the format (no sample_id, question_id or self_instruct key)")


def load_conversations(path=None, n: int = 20, seed: int = 0, split: str | None = None) -> list[Conversation]:
    """Synthetic conversations (n, seed) when `path` is None, else the file's; optionally one split."""
    if path is None:
        from memr1.rl.data.synthetic import load_synthetic
        convs = load_synthetic(n, seed)
    else:
        fmt = detect_format(path)
        if fmt == "locomo":
            convs = load_locomo(path)
        elif fmt == "longmemeval":
            from memr1.rl.data.longmemeval import load_longmemeval
            convs = load_longmemeval(path)
        else:
            from memr1.rl.data.msc import load_msc
            convs = load_msc(path)
    return [c for c in convs if split is None or c.split == split]
