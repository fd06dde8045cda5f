"""The rule-built stores the learned manager is compared with. RAG (LoCoMo's baseline): every raw turn is
a memory of its speaker, dated by its session. ADD-every-fact (`fact_bank`): every fact of every turn is
ADDed, nothing is updated or deleted, so the bank keeps every version of a changing fact.

Real data holds turns a bank refuses as they are: a turn longer than a memory may be (the bank's
`max_text_bytes`, 4,096 bytes by default; LongMemEval has 5 KB assistant turns) is split at word
boundaries into several memories, and a turn without a speaker is left out, since retrieval is per
speaker. Both are counted (`input_counts`) and the eval report carries the counts.
"""
from __future__ import annotations

import re

import msgspec

from memr1.memory_store import Add, BankConfig, BankError, MemoryBank
from memr1.rl.task.data.locomo import DataError

_SPACES = re.compile(r"\s*")   # what str.lstrip removes
# The most a memory's text may hold in the banks made here (BankConfig's default, 4,096 bytes).
MAX_TEXT_BYTES = next(f.default for f in msgspec.structs.fields(BankConfig) if f.name == "max_text_bytes")


def split_text(text: str, limit: int) -> list[str]:
    """`text` in pieces of at most `limit` UTF-8 bytes, cut at a space where one is near the end. Each
    piece looks at only its own window (at most `limit` characters), so a 10 MB turn is not re-encoded
    once per piece."""
    pieces, pos = [], 0
    left = len(text.encode())   # the bytes of text[pos:]
    while left > limit:
        head = text[pos:pos + limit].encode()[:limit].decode("utf-8", errors="ignore")
        cut = head.rfind(" ")
        if cut < len(head) // 2:   # no space in the second half: cut inside the word
            cut = len(head)
        pieces.append(head[:cut].rstrip())
        nxt = _SPACES.match(text, pos + cut).end()   # the next piece starts at a word
        left -= len(text[pos:nxt].encode())
        pos = nxt
    return pieces + ([text[pos:]] if pos < len(text) else [])


def has_speaker(turn) -> bool:
    return bool(turn.speaker.strip())


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))   # a lone surrogate is counted, not raised on


def input_counts(turns: list, limit: int = MAX_TEXT_BYTES) -> dict:
    """What the bank pipelines leave out or split, over the turns they read."""
    return {"turns": len(turns),
            "empty_speaker_skipped": sum(not has_speaker(t) for t in turns),
            "long_turns_split": sum(has_speaker(t) and _bytes(f"{t.speaker}: {t.text}") > limit for t in turns)}


def rag_bank(conv, embedder, turns: list, limit: int = MAX_TEXT_BYTES) -> MemoryBank:
    """The bank of `turns` (of conversation `conv`). A turn the bank still refuses raises a DataError
    naming the conversation and the turn."""
    rows = []   # (turn, memory text)
    for t in turns:
        if not has_speaker(t) or not t.text.strip():
            continue
        prefix = f"{t.speaker}: "
        room = limit - _bytes(prefix)
        if room < 64:   # a speaker name of nearly 4 KB: no room left for the turn's words
            raise DataError(f"{conv.sample_id} turn {t.dia_id}: the speaker name is {_bytes(t.speaker)} "
                            f"bytes; a memory holds {limit}")
        try:
            rows += [(t, prefix + piece) for piece in split_text(t.text, room)]
        except UnicodeError as e:
            raise DataError(f"{conv.sample_id} turn {t.dia_id}: the text is not valid Unicode ({e})") from None
    bank = MemoryBank.create(None, dim=embedder.dim)
    if not rows:
        return bank
    vectors = embedder.embed([text for _, text in rows])
    ops = [Add(text=text, vector=v, speaker=t.speaker, timestamp=t.timestamp, sources=(t.dia_id,)) for (t, text), v in zip(rows, vectors)]
    try:
        bank.apply_batch(ops)
    except (BankError, ValueError, UnicodeError):   # find the turn, and say which
        bank.close()
        bank = MemoryBank.create(None, dim=embedder.dim)
        for (t, _), op in zip(rows, ops):
            try:
                bank.apply(op)
            except (BankError, ValueError, UnicodeError) as e:
                bank.close()
                raise DataError(f"{conv.sample_id} turn {t.dia_id}: the memory bank refuses it "
                                f"({type(e).__name__}: {e})") from None
    return bank


def fact_bank(turns: list, facts: list[list[str]], embedder) -> MemoryBank:
    """Every fact of `turns` (one fact list per turn, as rl/task/facts.py gives them) ADDed as a memory of
    the turn's speaker, dated by its session: the manager that knows no operation but ADD."""
    rows = [(t, f) for t, fs in zip(turns, facts) if has_speaker(t) for f in fs or () if f.strip()]
    bank = MemoryBank.create(None, dim=embedder.dim)
    if rows:
        vectors = embedder.embed([f for _, f in rows])
        bank.apply_batch([Add(text=f, vector=v, speaker=t.speaker, timestamp=t.timestamp, sources=(t.dia_id,))
                          for (t, f), v in zip(rows, vectors)])
    return bank
