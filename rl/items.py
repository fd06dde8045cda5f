"""Training items of the two Memory-R1 stages, with the memory banks they start from.

Manager item: one fact-bearing turn, the bank as it stood before that turn, and the questions whose
last evidence is that turn (so the bank after the turn holds all the evidence they need).
Answer item: one question and the bank of its whole conversation.

Banks come from a frozen pipeline (stage 2's may instead come from the trained stage-1 manager; see
ItemsConfig.answer_banks), built once per conversation in dialogue order; the bank before
each turn is an O(1) fork taken on the way, so thousands of snapshots share one structure.
  - "oracle": the synthetic data's ground-truth ops (ADD/UPDATE/DELETE per fact slot);
  - "raw": every turn's text is ADDed as a memory (the RAG-style pipeline; works on any data).
"""
import random
from dataclasses import dataclass
from typing import Literal

import msgspec

from memr1.memory_store import Add, Delete, MemoryBank, Update
from memr1.rl.data.locomo import QA, Conversation


class ItemsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    bank_pipeline: Literal["oracle", "raw"] = "oracle"
    # Stage 2's banks: "manager" = built by the frozen stage-1 manager (memr1 train does it, see
    # engine/train.py), "pipeline" = the bank_pipeline's banks, as stage 1 uses.
    answer_banks: Literal["manager", "pipeline"] = "manager"
    manager_checkpoint: str = ""   # stage 2 alone: the stage-1 manager to build banks with ("" = base)
    max_questions_per_item: int = 2
    seed: int = 0


@dataclass
class ManagerItem:
    conversation: str
    dia_id: str
    speaker: str
    timestamp: str
    facts: list[str]
    bank: MemoryBank               # before this turn (a fork; never written)
    questions: list[QA]
    speakers: tuple[str, str]


@dataclass
class AnswerItem:
    conversation: str
    question: QA
    bank: MemoryBank
    speakers: tuple[str, str]


def _last_evidence(conv: Conversation) -> dict[str, list[QA]]:
    order = {t.dia_id: i for i, t in enumerate(conv.turns())}
    out: dict[str, list[QA]] = {}
    for qa in conv.qa:
        known = [e for e in qa.evidence if e in order]
        if known:
            out.setdefault(max(known, key=order.get), []).append(qa)
    return out


def build_items(conversations: list[Conversation], embedder, cfg: ItemsConfig
                ) -> tuple[list[ManagerItem], list[AnswerItem]]:
    """Walk each conversation once, applying the frozen pipeline, and snapshot the bank per turn."""
    manager_items, answer_items = [], []
    for conv in conversations:
        speakers = (conv.speaker_a, conv.speaker_b)
        bank = MemoryBank.create(None, dim=embedder.dim)
        asked = _last_evidence(conv)
        turns, oracle = conv.turns(), {}
        if cfg.bank_pipeline == "oracle":
            if not conv.oracle:
                raise ValueError(f"{conv.sample_id}: bank_pipeline='oracle' needs synthetic data with an oracle; "
                                 f"use bank_pipeline='raw' for LoCoMo")
            timeline = conv.oracle["timeline"]
            for e, v in zip(timeline, embedder.embed([e["memory"] for e in timeline])):  # one call per conversation
                oracle.setdefault(e["dia_id"], []).append((e, v))
        else:
            turn_vectors = embedder.embed([t.text for t in turns])
        slot_ids: dict[str, int] = {}
        for i, turn in enumerate(turns):
            events = oracle.get(turn.dia_id, [])
            facts = [e["fact"] for e, _ in events] if cfg.bank_pipeline == "oracle" else [turn.text]
            if facts and turn.dia_id in asked:
                manager_items.append(ManagerItem(conv.sample_id, turn.dia_id, turn.speaker, turn.timestamp, facts,
                                                 bank.fork(), asked[turn.dia_id][:cfg.max_questions_per_item],
                                                 speakers))
            if cfg.bank_pipeline == "raw":
                bank.apply(Add(turn.text, turn_vectors[i], turn.speaker, turn.timestamp))
            for e, vector in events:
                _apply_oracle_event(bank, e, vector, slot_ids, turn.timestamp)
        answer_items += [AnswerItem(conv.sample_id, qa, bank, speakers) for qa in conv.qa]
    rng = random.Random(cfg.seed)
    rng.shuffle(manager_items)
    rng.shuffle(answer_items)
    return manager_items, answer_items


def _apply_oracle_event(bank: MemoryBank, e: dict, vector, slot_ids: dict[str, int], timestamp: str) -> None:
    slot, event = e["slot"], e["event"]  # slots are per speaker ("Ivan/city")
    if event == "ADD":
        slot_ids[slot] = bank.apply(Add(e["memory"], vector, e["speaker"], timestamp))
    elif event == "UPDATE":
        bank.apply(Update(slot_ids[slot], e["memory"], vector, timestamp))
    elif event == "DELETE":
        bank.apply(Delete(slot_ids.pop(slot)))


def step_items(items: list, step: int, per_step: int) -> list:
    """The items of `step`: a fixed walk over the shuffled list, so a resumed run sees the same order."""
    if not items:
        raise ValueError("no training items: the data has no questions whose evidence the pipeline covers")
    start = step * per_step
    return [items[(start + i) % len(items)] for i in range(per_step)]
