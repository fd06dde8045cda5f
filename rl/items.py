"""Training items of the two Memory-R1 stages, and the banks they start from.

Manager item: one manager call, cut exactly as evaluation cuts them (`banks.stream_groups`: up to
`manager.turns_per_call` consecutive fact-bearing turns of one speaker in one session), the bank
before that call, and questions whose last evidence turn the call decides. Every question reaches
some item: one whose evidence turn carried no facts goes to the nearest earlier call (or the first),
and a call with more than `max_questions_per_item` questions becomes several items.
Answer item: one question and the bank of its whole conversation.

The bank before a call holds every memory from the turns before it, plus the other speaker's up to
the call's last turn (the manager only touches its own speaker's memories, and the questions may need
both). Two pipelines build it:
  - "oracle": the synthetic data's ground-truth ops (ADD/UPDATE/DELETE per fact slot);
  - "manager": the paper's: the base manager over the preceding `window_turns` turns, from the same
    facts as the call (built by the caller with `banks.run_manager` on `history_conversation`s).
"""
import random
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from memr1.memory_store import Add, Delete, MemoryBank, Update
from memr1.rl.banks import stream_groups
from memr1.rl.data.locomo import QA, Conversation, Session


class ItemsConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    bank_pipeline: Literal["oracle", "manager"] = "manager"  # stage-1 banks (see the module doc)
    window_turns: Annotated[int, Meta(ge=0)] = 50   # "manager": the bank is built from this many preceding turns
    answer_banks: Literal["oracle", "manager"] = "manager"   # the answer stage's banks: the synthetic
                                    # oracle's, or built by the run's latest manager (the paper's stage 2)
    max_questions_per_item: Annotated[int, Meta(ge=1)] = 2


@dataclass
class CallSpec:
    """A manager call and the questions it decides, before its bank exists."""
    conv: Conversation
    call: dict                     # speaker, session, timestamp, dia_ids, facts (banks.stream_groups)
    questions: list[QA]
    first: int                     # index (in conv.turns()) of the call's first turn
    end: int                       # one past the call's last turn


@dataclass
class ManagerItem:
    conversation: str
    call: dict
    bank: MemoryBank               # before this call (never written; rollouts fork it)
    questions: list[QA]
    speakers: tuple[str, str]

    @property
    def source(self) -> str:
        return f"{self.conversation} {','.join(self.call['dia_ids'])}"


@dataclass
class AnswerItem:
    conversation: str
    question: QA
    bank: MemoryBank
    speakers: tuple[str, str]

    @property
    def source(self) -> str:
        return f"{self.conversation} Q:{self.question.question[:40]}"


def manager_calls(conversations: list[Conversation], facts: dict[str, list[list[str]]], turns_per_call: int,
                  every_call: bool = False) -> list[CallSpec]:
    """Every call that decides at least one question, each with all of its questions (every_call: all
    calls, in dialogue order, questions or not)."""
    specs = []
    for conv in conversations:
        turns = conv.turns()
        order = {t.dia_id: i for i, t in enumerate(turns)}
        calls = sorted((g for gs in stream_groups(turns, facts[conv.sample_id], turns_per_call).values() for g in gs),
                       key=lambda g: order[g["dia_ids"][-1]])
        if not calls:
            continue
        asked: dict[int, list[QA]] = {}
        for qa in conv.qa:
            known = [order[e] for e in qa.evidence if e in order]
            last = max(known) if known else len(turns) - 1
            decided = [i for i, g in enumerate(calls) if order[g["dia_ids"][-1]] <= last]
            asked.setdefault(decided[-1] if decided else 0, []).append(qa)
        for i in range(len(calls)) if every_call else sorted(asked):
            g = calls[i]
            specs.append(CallSpec(conv, g, asked.get(i, []), order[g["dia_ids"][0]], order[g["dia_ids"][-1]] + 1))
    return specs


def in_history(spec: CallSpec, index: int, speaker: str) -> bool:
    """Whether turn `index` by `speaker` is in the bank before the call (see the module doc)."""
    return index < spec.first or (speaker != spec.call["speaker"] and index < spec.end)


def oracle_bank(spec: CallSpec | None, conv: Conversation, embedder) -> MemoryBank:
    """The synthetic oracle's bank: the ground-truth ops of the call's history (all turns: None)."""
    if not conv.oracle:
        raise ValueError(f"{conv.sample_id}: the oracle pipeline needs synthetic data with an oracle; "
                         f"use items.bank_pipeline='manager' (and answer_banks='manager') for this data")
    order = {t.dia_id: i for i, t in enumerate(conv.turns())}
    stamp = {t.dia_id: t.timestamp for t in conv.turns()}
    events = [e for e in conv.oracle["timeline"]
              if spec is None or in_history(spec, order[e["dia_id"]], e["speaker"])]
    bank, slots = MemoryBank.create(None, dim=embedder.dim), {}
    for e, vector in zip(events, embedder.embed([e["memory"] for e in events]) if events else []):
        ts = stamp[e["dia_id"]]
        if e["event"] == "ADD":
            slots[e["slot"]] = bank.apply(Add(e["memory"], vector, e["speaker"], ts))
        elif e["event"] == "UPDATE":
            bank.apply(Update(slots[e["slot"]], e["memory"], vector, ts))
        elif e["event"] == "DELETE":
            bank.apply(Delete(slots.pop(e["slot"])))
    return bank


def history_conversation(spec: CallSpec, facts: list[list[str]], window: int) -> tuple[Conversation, list]:
    """The call's history as a conversation of its own (the preceding `window` turns) and its per-turn
    facts, for the base manager to build the "manager" pipeline's bank with `banks.run_manager`."""
    turns = spec.conv.turns()
    keep = range(max(0, spec.first - window), spec.end)
    kept = [(turns[i], facts[i] if in_history(spec, i, turns[i].speaker) else []) for i in keep]
    sessions: dict[str, list] = {}
    for turn, _ in kept:
        sessions.setdefault(turn.dia_id.split(":")[0], []).append(turn)
    conv = Conversation(sample_id=f"{spec.conv.sample_id}@{spec.call['dia_ids'][0]}",
                        speaker_a=spec.conv.speaker_a, speaker_b=spec.conv.speaker_b,
                        sessions=[Session(i, ts[0].timestamp, ts) for i, ts in enumerate(sessions.values(), 1)],
                        qa=[], split=spec.conv.split)
    return conv, [f for _, f in kept]


def manager_items(specs: list[CallSpec], banks: list[MemoryBank], cfg: ItemsConfig, seed: int) -> list[ManagerItem]:
    """One item per call and chunk of at most `max_questions_per_item` questions, shuffled by `seed`."""
    out = []
    for spec, bank in zip(specs, banks):
        speakers = (spec.conv.speaker_a, spec.conv.speaker_b)
        for i in range(0, max(len(spec.questions), 1), cfg.max_questions_per_item):
            out.append(ManagerItem(spec.conv.sample_id, spec.call, bank,
                                   spec.questions[i:i + cfg.max_questions_per_item], speakers))
    random.Random(seed).shuffle(out)
    return out


def answer_items(conversations: list[Conversation], banks: dict[str, MemoryBank], seed: int) -> list[AnswerItem]:
    """One item per question, on its conversation's bank, shuffled by `seed`."""
    out = [AnswerItem(c.sample_id, qa, banks[c.sample_id], (c.speaker_a, c.speaker_b))
           for c in conversations if c.sample_id in banks for qa in c.qa]
    random.Random(seed).shuffle(out)
    return out


def step_items(items: list, step: int, per_step: int, rank: int = 0, world: int = 1) -> list:
    """This rank's contiguous share of the items of `step`: a fixed walk over the shuffled list, so a
    resumed run sees the same order (the caller checks that per_step divides over the ranks)."""
    if not items:
        raise ValueError("no training items: the data has no questions the pipeline can reach")
    share = per_step // world
    start = step * per_step + rank * share
    return [items[(start + i) % len(items)] for i in range(share)]
