"""Evidence recall (Memory-R2's M-Fail): did the bank keep what a question needs?

Memories carry the dialogue turns they were written from (`Memory.sources`: an ADD's call turns, and
each UPDATE's). A question's needed turns are its evidence turns that carry facts (a turn without facts
gives the manager nothing to write; facts unknown: every evidence turn). A question *misses* when one
of its needed turns is the source of no live memory. Questions that need nothing are not counted:
those without such turns, and those answered "none" (their evidence is a turn that ended a fact, which
a correct bank no longer holds).

Where a question's evidence is a turn that changed no memory (a restatement of what a memory already
says), even a perfect bank misses it; on the synthetic data the oracle's banks miss nothing (tested),
and on other data read a manager's rate beside a RAG bank's (`memr1 eval --baseline rag`, 0 by
construction) and the questions' evidence annotations.
"""
from __future__ import annotations

from memr1.rl.task.data.locomo import QA


def stored_turns(bank) -> set[str]:
    """Every dialogue turn some live memory of `bank` came from."""
    return {s for m in bank for s in m.sources}


def needed_turns(qa: QA, fact_turns: set[str] | None) -> list[str]:
    """The question's evidence turns a bank must hold (module doc); [] when it needs none."""
    if qa.answer.strip().lower() == "none":
        return []
    return [e for e in qa.evidence if fact_turns is None or e in fact_turns]


def evidence_misses(stored: set[str], questions: list[QA], fact_turns: set[str] | None) -> tuple[int, int]:
    """(questions that miss a needed turn, questions counted) for one bank's stored turns."""
    missed = counted = 0
    for qa in questions:
        need = needed_turns(qa, fact_turns)
        if need:
            counted += 1
            missed += any(e not in stored for e in need)
    return missed, counted


def fact_turns_of(conv, facts: list[list[str]] | None) -> set[str] | None:
    """The conversation's turns that carry facts (None when its facts are unknown)."""
    if facts is None:
        return None
    return {t.dia_id for t, f in zip(conv.turns(), facts) if f}


def miss_rate(misses: list[tuple[int, int]]) -> float | None:
    """The share of counted questions that miss, over several banks' (missed, counted)."""
    counted = sum(c for _, c in misses)
    return sum(m for m, _ in misses) / counted if counted else None
