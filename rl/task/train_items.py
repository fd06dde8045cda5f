"""Training items of the two Memory-R1 stages, and the banks they start from.

Manager item: one manager call, cut exactly as evaluation cuts them (`banks.stream_groups`: up to
`manager.turns_per_call` consecutive fact-bearing turns of one speaker in one session), the bank
before that call, and the questions its ops can change:
  - decided questions: a question belongs to the call that contains its last evidence turn that
    carries facts (the turn whose facts set the answer's final state). Evidence turns without facts
    are skipped in that choice: no call reads them, so no call's ops can write them. A question none
    of whose evidence turns carries facts can be changed by no call; it is left out and counted
    (`CallStats.unreachable`). So every question's fact-bearing evidence lies inside its call or in
    the call's bank history, never after the call. A call with more than `max_questions_per_item`
    decided questions becomes several items.
  - guard questions (synthetic data, `items.guard_questions` per item): questions whose evidence all
    lies in the call's history and whose answer sits in a memory the call's prompt shows. The right
    ops keep those answers; an UPDATE of the wrong memory, a DELETE of a live one or an UPDATE that
    swaps a detailed memory for a vaguer restatement loses them. Without guards, a call made only of
    restatements (the right op is NONE) decides no question and RL never sees it.
An item whose reward cannot depend on its call (`dead_items`: no decided question and no guard) is a
bug; the stage logs the count at its start.
Answer item: one question and the bank of its whole conversation.

The bank before a call holds every memory from the turns before it, plus the other speaker's up to
the call's last turn (the manager only touches its own speaker's memories, and the questions may need
both). Two pipelines build it:
  - "oracle": the synthetic data's ground-truth ops (ADD/UPDATE/DELETE per fact slot);
  - "manager": the paper's: the base manager over the preceding `window_turns` turns, from the same
    facts as the call (built by the caller with `banks.run_manager` on `history_conversation`s).
"""
import random
from dataclasses import dataclass, field
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from memr1.memory_store import Add, Delete, MemoryBank, Update
from memr1.rl.task.banks import stream_groups
from memr1.rl.task.data.errors import DataError
from memr1.rl.task.data.locomo import QA, Conversation, Session


class ItemsConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    bank_pipeline: Literal["oracle", "manager"] = "manager"  # stage-1 banks (see the module doc)
    window_turns: Annotated[int, Meta(ge=0, le=1_000_000)] = 50   # "manager": the bank is built from this many preceding turns
    answer_banks: Literal["oracle", "manager", "mix"] = "manager"   # the answer stage's banks: the synthetic
                                    # oracle's, built by the run's latest manager (the paper's stage 2), or
                                    # "mix": every other item on the oracle's banks, the rest on banks that
                                    # ADD every fact, so the reader has seen stale copies beside clean banks
    max_questions_per_item: Annotated[int, Meta(ge=1, le=10_000)] = 2   # decided questions per item
    guard_questions: Annotated[int, Meta(ge=0, le=10_000)] = 2   # per item, with the oracle pipeline (module doc); the
                                    # paper does not say which questions score a call: ours are the ones it can change


@dataclass
class CallSpec:
    """A manager call and the questions it decides, before its bank exists."""
    conv: Conversation
    call: dict                     # speaker, session, timestamp, dia_ids, facts (banks.stream_groups)
    questions: list[QA]            # decided here (module doc)
    first: int                     # index (in conv.turns()) of the call's first turn
    end: int                       # one past the call's last turn


@dataclass
class ManagerItem:
    conversation: str
    call: dict
    bank: MemoryBank               # before this call (never written; rollouts fork it)
    decided: list[QA]              # questions whose answer this call sets
    speakers: tuple[str, str]
    guards: list[QA] = field(default_factory=list)   # questions on memories the prompt shows
    shown: list[str] = field(default_factory=list)   # the memory texts the call's prompt shows (when known)

    @property
    def questions(self) -> list[QA]:
        """Every question the reward scores: the decided ones, then the guards."""
        return self.decided + self.guards

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


@dataclass
class CallStats:
    """What `manager_calls` could not place: questions none of whose evidence turns carries facts."""
    questions: int = 0
    unreachable: int = 0


def deciding_turn(qa: QA, order: dict[str, int], facts: list[list[str]]) -> int | None:
    """Index of the question's last evidence turn that carries facts (None: no such turn)."""
    known = [order[e] for e in qa.evidence if e in order and facts[order[e]]]
    return max(known) if known else None


def manager_calls(conversations: list[Conversation], facts: dict[str, list[list[str]]], turns_per_call: int,
                  every_call: bool = False, stats: CallStats | None = None) -> list[CallSpec]:
    """Every call that decides at least one question, each with all of its questions (every_call: all
    calls, in dialogue order, questions or not). `stats` receives the unreachable count."""
    specs = []
    for conv in conversations:
        turns = conv.turns()
        order = {t.dia_id: i for i, t in enumerate(turns)}
        calls = sorted((g for gs in stream_groups(turns, facts[conv.sample_id], turns_per_call).values() for g in gs),
                       key=lambda g: order[g["dia_ids"][-1]])
        call_of = {d: i for i, g in enumerate(calls) for d in g["dia_ids"]}
        asked: dict[int, list[QA]] = {}
        for qa in conv.qa:
            turn = deciding_turn(qa, order, facts[conv.sample_id])
            if stats is not None:
                stats.questions += 1
                stats.unreachable += turn is None or turns[turn].dia_id not in call_of
            if turn is not None and turns[turn].dia_id in call_of:   # a turn without a speaker has no call
                asked.setdefault(call_of[turns[turn].dia_id], []).append(qa)
        for i in range(len(calls)) if every_call else sorted(asked):
            g = calls[i]
            specs.append(CallSpec(conv, g, asked.get(i, []), order[g["dia_ids"][0]], order[g["dia_ids"][-1]] + 1))
    return specs


def in_history(spec: CallSpec, index: int, speaker: str) -> bool:
    """Whether turn `index` by `speaker` is in the bank before the call (see the module doc)."""
    return index < spec.first or (speaker != spec.call["speaker"] and index < spec.end)


def oracle_banks(specs: list[CallSpec], embedder) -> list[MemoryBank]:
    """`oracle_bank` of each spec, with every memory text embedded once, in one call."""
    texts = list(dict.fromkeys(e["memory"] for c in {id(s.conv): s.conv for s in specs}.values()
                               for e in (c.oracle or {}).get("timeline", [])))
    vectors = dict(zip(texts, embedder.embed(texts))) if texts else {}
    return [oracle_bank(s, s.conv, embedder, vectors) for s in specs]


def oracle_bank(spec: CallSpec | None, conv: Conversation, embedder, vectors: dict | None = None) -> MemoryBank:
    """The synthetic oracle's bank: the ground-truth ops of the call's history (all turns: None).
    `vectors`: text -> embedding, for texts already embedded (`oracle_banks`)."""
    if not conv.oracle:
        raise ValueError(f"{conv.sample_id}: the oracle pipeline needs synthetic data with an oracle; "
                         f"use items.bank_pipeline='manager' (and answer_banks='manager') for this data")
    order = {t.dia_id: i for i, t in enumerate(conv.turns())}
    stamp = {t.dia_id: t.timestamp for t in conv.turns()}
    events = [e for e in conv.oracle["timeline"]
              if spec is None or in_history(spec, order[e["dia_id"]], e["speaker"])]
    bank, slots = MemoryBank.create(None, dim=embedder.dim), {}
    texts = [e["memory"] for e in events]
    embedded = [vectors[t] for t in texts] if vectors is not None else embedder.embed(texts) if events else []
    for e, vector in zip(events, embedded):
        ts = stamp[e["dia_id"]]
        if e["event"] == "ADD":
            slots[e["slot"]] = bank.apply(Add(e["memory"], vector, e["speaker"], ts, (e["dia_id"],)))
        elif e["event"] == "UPDATE":
            bank.apply(Update(slots[e["slot"]], e["memory"], vector, ts, (e["dia_id"],)))
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


def guard_candidates(spec: CallSpec, shown_texts: list[str]) -> list[QA]:
    """The conversation's questions that the call's ops can break (module doc), most relevant first:
    every evidence turn in the call's bank history, and an evidence memory among the memories the
    prompt shows (`shown_texts`, in the prompt's order). Needs the synthetic oracle."""
    order = {t.dia_id: i for i, t in enumerate(spec.conv.turns())}
    entry = {e["dia_id"]: e for e in spec.conv.oracle["timeline"]}
    rank = {text: i for i, text in reversed(list(enumerate(shown_texts)))}
    decided = {id(q) for q in spec.questions}
    found = []
    for qa in spec.conv.qa:
        evidence = [entry.get(e) for e in qa.evidence]
        if id(qa) in decided or not evidence or any(
                e is None or e["event"] == "DELETE" or not in_history(spec, order[e["dia_id"]], e["speaker"])
                for e in evidence):
            continue
        hits = [rank[e["memory"]] for e in evidence if e["memory"] in rank]
        if hits:
            found.append((min(hits), len(found), qa))
    return [qa for _, _, qa in sorted(found, key=lambda x: x[:2])]


def manager_items(specs: list[CallSpec], banks: list[MemoryBank], cfg: ItemsConfig, seed: int,
                  shown: list[list[str]] | None = None, keep_empty: bool = True) -> list[ManagerItem]:
    """One item per call and chunk of at most `max_questions_per_item` decided questions, shuffled by
    `seed`. `shown`: per spec, the memory texts its prompt shows, which picks each item's guard
    questions (oracle data only); a call that decides nothing but has guards is one item, and one with
    neither is kept only with `keep_empty` (a warm start imitates every call)."""
    out = []
    for i, (spec, bank) in enumerate(zip(specs, banks)):
        speakers = (spec.conv.speaker_a, spec.conv.speaker_b)
        guards = (guard_candidates(spec, shown[i])[:cfg.guard_questions]
                  if shown is not None and cfg.guard_questions and spec.conv.oracle else [])
        if not (spec.questions or guards or keep_empty):
            continue
        for j in range(0, max(len(spec.questions), 1), cfg.max_questions_per_item):
            out.append(ManagerItem(spec.conv.sample_id, spec.call, bank,
                                   spec.questions[j:j + cfg.max_questions_per_item], speakers, guards,
                                   shown[i] if shown is not None else []))
    random.Random(seed).shuffle(out)
    return out


def live_questions(item: ManagerItem, oracle: dict | None) -> list[bool]:
    """Per question of the item: can the call's ops change its answer? Yes when one of its evidence
    turns is inside the call, or (with the oracle) one of its evidence memories is shown to the manager."""
    inside = set(item.call["dia_ids"])
    memory = {e["dia_id"]: e["memory"] for e in oracle["timeline"]} if oracle else {}
    shown = set(item.shown)
    return [any(e in inside or memory.get(e) in shown for e in qa.evidence) for qa in item.questions]


def dead_items(items: list[ManagerItem], oracles: dict) -> int:
    """Items whose reward cannot depend on their call: none of their questions is live."""
    return sum(not any(live_questions(it, oracles.get(it.conversation))) for it in items)


def answer_items(conversations: list[Conversation], banks: dict[str, MemoryBank], seed: int) -> list[AnswerItem]:
    """One item per question, on its conversation's bank, shuffled by `seed`."""
    out = [AnswerItem(c.sample_id, qa, banks[c.sample_id], (c.speaker_a, c.speaker_b))
           for c in conversations if c.sample_id in banks for qa in c.qa]
    random.Random(seed).shuffle(out)
    return out


def mixed_answer_items(conversations: list[Conversation], first: dict[str, MemoryBank], second: dict[str, MemoryBank],
                       seed: int) -> list[AnswerItem]:
    """answer_items' questions in its order, alternately on `first`'s and `second`'s bank of their
    conversation: each question once, half of them (and of each conversation's, give or take one) on each."""
    a, b = answer_items(conversations, first, seed), answer_items(conversations, second, seed)
    return [x if i % 2 == 0 else y for i, (x, y) in enumerate(zip(a, b))]


def step_items(items: list, step: int, per_step: int, rank: int = 0, world: int = 1) -> list:
    """This rank's contiguous share of the items of `step`: a fixed walk over the shuffled list, so a
    resumed run sees the same order (the caller checks that per_step divides over the ranks)."""
    if not items:
        raise DataError("no training items: the data has no questions the pipeline can reach (with "
                        "extract.source=model, did the model extract any facts?)")
    share = per_step // world
    start = step * per_step + rank * share
    return [items[(start + i) % len(items)] for i in range(share)]
