"""Session-level memory rollouts (Memory-R2's LoGo-GRPO) on O(1) forks: the episode items, their
question samples, the rewards of both levels and the advantages that merge them.

An episode runs the manager over the first `sessions` sessions of one conversation, every call in
dialogue order, each applied to the episode's own bank (empty at the start, as in Memory-R2). G
episodes of one item run side by side; the bank of each is snapshotted (a fork: two root pointers) at
every session boundary, and kept only while a re-roll may start from it.

Global level: each episode's final bank answers a sample of the window's questions (at most
`global_questions`, the same sample for all G); session k is credited with the questions whose deciding
turn (the last evidence turn that carries facts, rl/task/train_items.py) lies in session k, and every call of
session k in that episode gets the session's advantage, z-scored over the G episodes.
Local level (the re-rolls): for each session k, with probability `reroll_prob`, one episode is picked
and session k is run again `inner_n` times from its snapshot at k - 1, sampled at the training
temperature (Memory-R2's code decodes its re-rolls greedily, which can make a local group's rewards all
equal); each re-roll's bank right after session k answers at most `local_questions` questions answerable
by then (those decided in session k first), the same sample for the group.
Both levels subtract the compression penalty lam * max(0, memory_words - free_ratio * session_words) /
session_words (words of the bank's memories against the words of the dialogue so far), and an episode
(or re-roll) with a call that hit its token budget without a parsable reply is unfinished: reward 0.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Annotated

import msgspec
from msgspec import Meta

from memr1.rl.task.banks import stream_groups
from memr1.rl.task.data.locomo import QA, Conversation
from memr1.rl.task.evidence import fact_turns_of
from memr1.rl.task.train_items import deciding_turn


class Phase(msgspec.Struct, frozen=True, array_like=True):
    """One step of the session curriculum: [sessions, steps, compression]."""
    sessions: Annotated[int, Meta(ge=1, le=1000)]
    steps: Annotated[int, Meta(ge=1, le=1_000_000)]
    compression: Annotated[float, Meta(ge=0, le=100)]


class EpisodeConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    sessions: Annotated[int, Meta(ge=1, le=1000)] = 4      # S: the window, from the conversation's first session
    reroll_prob: Annotated[float, Meta(ge=0, le=1)] = 0.5  # per session, the chance of a local re-roll group
    inner_n: Annotated[int, Meta(ge=2, le=1024)] = 4       # re-rolls per local group
    local_questions: Annotated[int, Meta(ge=1, le=100_000)] = 16
    global_questions: Annotated[int, Meta(ge=1, le=100_000)] = 64
    compression: Annotated[float, Meta(ge=0, le=100)] = 0.0   # lam of the compression penalty
    free_ratio: Annotated[float, Meta(ge=0, le=100)] = 0.7    # memory words free per dialogue word
    global_weight: Annotated[float, Meta(ge=0, le=100)] = 1.0  # each level's advantages are scaled by its weight
    local_weight: Annotated[float, Meta(ge=0, le=100)] = 1.0
    # [[sessions, steps, compression], ...]: the stage runs each phase in turn (its steps are the sum),
    # each from the previous phase's best-validation checkpoint when loop.validate_every is set; empty:
    # one phase of `sessions` and `compression` for the stage's steps.
    curriculum: list[Phase] = []
    # The promotion gate: a phase hands on only if its best validation's evidence-miss rate is at most
    # this (1.0: always).
    max_evidence_miss: Annotated[float, Meta(ge=0, le=1)] = 1.0

    def phases(self, steps: int) -> list[Phase]:
        return list(self.curriculum) or [Phase(self.sessions, steps, self.compression)]

    def bounds(self, steps: int) -> list[tuple[int, int]]:
        """[(first step, one past the last step)] of each phase (0-based steps)."""
        out, begin = [], 0
        for p in self.phases(steps):
            out.append((begin, begin + p.steps))
            begin += p.steps
        return out


@dataclass
class EpisodeItem:
    """One conversation's window: its calls per session and its questions by deciding session."""
    conv: Conversation
    calls: list[list[dict]]          # per session of the window: the manager calls (banks.stream_groups), in order
    session_words: list[int]         # per session: words of the dialogue up to and including it
    credited: list[list[QA]]         # per session: questions whose deciding turn lies in it
    speakers: tuple[str, str] = ("", "")
    session_of: dict = field(default_factory=dict)   # dia_id -> the window session its turn is in
    fact_turns: set = field(default_factory=set)     # the turns that carry facts (rl/task/evidence.py)

    @property
    def source(self) -> str:
        return f"{self.conv.sample_id} S1-{len(self.calls)}"


def episode_items(conversations: list[Conversation], facts: dict[str, list[list[str]]], turns_per_call: int,
                  sessions: int) -> list[EpisodeItem]:
    """One item per conversation with at least one question decided inside its first `sessions` sessions."""
    out = []
    for conv in conversations:
        turns = conv.turns()
        order = {t.dia_id: i for i, t in enumerate(turns)}
        session_of, words, total = {}, [], 0
        for k, s in enumerate(conv.sessions[:sessions]):
            for t in s.turns:
                session_of[t.dia_id] = k
                total += len(t.text.split())
            words.append(total)
        window = len(words)
        per_session: list[list[dict]] = [[] for _ in range(window)]
        groups = stream_groups(turns, facts[conv.sample_id], turns_per_call)
        for g in sorted((g for gs in groups.values() for g in gs), key=lambda g: order[g["dia_ids"][-1]]):
            k = session_of.get(g["dia_ids"][-1])
            if k is not None:
                per_session[k].append(g)
        credited: list[list[QA]] = [[] for _ in range(window)]
        for qa in conv.qa:
            turn = deciding_turn(qa, order, facts[conv.sample_id])
            last = max((order[e] for e in qa.evidence if e in order), default=None)
            # every evidence turn inside the window, so the final bank can hold the answer
            if turn is not None and last is not None and turns[last].dia_id in session_of:
                credited[session_of[turns[turn].dia_id]].append(qa)
        if any(credited):
            out.append(EpisodeItem(conv, per_session, words, credited, (conv.speaker_a, conv.speaker_b), session_of,
                                   fact_turns_of(conv, facts[conv.sample_id])))
    return out


def global_sample(item: EpisodeItem, cap: int, rng: random.Random) -> list[tuple[int, QA]]:
    """(session, question) pairs scored on the final banks: at most `cap`, the same for all G episodes."""
    pairs = [(k, qa) for k, qs in enumerate(item.credited) for qa in qs]
    return pairs if len(pairs) <= cap else sorted(rng.sample(pairs, cap), key=lambda p: p[0])


def local_sample(item: EpisodeItem, k: int, cap: int, rng: random.Random) -> list[QA]:
    """Questions answerable once session k is done, those decided in session k first, at most `cap`."""
    now = list(item.credited[k])
    earlier = [qa for j in range(k) for qa in item.credited[j]]
    rng.shuffle(now)
    rng.shuffle(earlier)
    return (now + earlier)[:cap]


def compression_penalty(memory_words: int, session_words: int, lam: float, free_ratio: float) -> float:
    """Memory-R2's penalty on a bank that outgrows its free share of the dialogue so far (>= 0)."""
    if not lam or session_words <= 0:
        return 0.0
    return lam * max(0.0, memory_words - free_ratio * session_words) / session_words


def bank_words(bank) -> int:
    return sum(len(m.text.split()) for m in bank)


def session_reward(scores: list[float], memory_words: int, session_words: int, kind: str, lam: float,
                   free_ratio: float, finished: bool = True) -> dict[str, float]:
    """The parts of one (episode, session) or re-roll reward: the mean answer score (named by the
    reward's kind) minus the compression penalty; 0 in every part for an unfinished episode."""
    if not finished:
        return {kind: 0.0, "compression": 0.0}
    outcome = sum(scores) / len(scores) if scores else 0.0
    return {kind: outcome, "compression": -compression_penalty(memory_words, session_words, lam, free_ratio)}
