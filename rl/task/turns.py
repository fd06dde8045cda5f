"""One Memory-R1 manager turn and one answer turn. Stage-1 rollouts, stage-2 and training-item bank
building, and evaluation all call these, so a policy is trained on exactly the inputs it is scored on.

Manager turn: the facts of one call (one or more consecutive turns of a speaker), that speaker, the
date, and a bank -> the prompt; a completion -> parsed ops -> a typed `ManagerOutcome`, applied to a
bank (a rollout's fork, or the durable bank being built) by `apply_outcomes`.

Retrieval scope, the one choice: the manager is shown (and may only touch) the memories of the
speaker whose facts it reads; its ADDs are tagged with that speaker. The two speakers of a conversation
are then independent streams that can be built in parallel, and the answer agent retrieves per speaker.

Answer turn: a question and a bank -> the prompt with the top-k memories of each speaker; a completion
-> the parsed answer.

`Task` holds the agents' settings these turns run with, one record for training and evaluation alike.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import msgspec

from memr1.memory_store import BankError
from memr1.rl.task.agents.answer import AnswerConfig, build_answer_messages
from memr1.rl.task.agents.extract import ExtractConfig
from memr1.rl.task.agents.manager import (ManagerConfig, ManagerPrompt, build_manager_prompt, memories_for_facts,
                                     parse_manager_output, to_store_ops)
from memr1.rl.generation import hit_cap


class Task(msgspec.Struct, frozen=True):
    """The agents' settings, which training and evaluation share: the run builds it once from its
    config, and stages, the warm start and evaluation all take it."""
    extract: ExtractConfig = ExtractConfig()
    manager: ManagerConfig = ManagerConfig()
    answer: AnswerConfig = AnswerConfig()


@dataclass
class ManagerTurn:
    facts: list[str]
    speaker: str
    timestamp: str
    prompt: ManagerPrompt          # chat messages + the bank ids behind the shown local ids
    sources: tuple[str, ...] = ()  # the call's dialogue turns, recorded on the memories it writes


class ManagerOutcome(msgspec.Struct):
    """What one manager completion did."""
    status: str            # ok | parse_error | hallucinated_id | invalid_item | bank_rejected
    parsed: bool           # the completion held the op JSON
    events: list[str]      # the valid ops' events, NONE included (ADD / UPDATE / DELETE / NONE)
    invalid_ops: int       # items dropped by the parser (unknown id or event, duplicate) + ops the bank refused
    truncated: bool        # the completion hit its token budget
    applied: bool = False  # its ops reached the bank (set by apply_outcomes)
    error: str = ""
    store_ops: list = msgspec.field(default_factory=list)   # the memory_store ops (NONE dropped)
    # each parsed UPDATE, DELETE and NONE: {"event", "local_id" (the shown id it gives), "old_memory" (the
    # text it copies)}, so a rollout can tell whether the two name the same shown memory
    refs: list = msgspec.field(default_factory=list)


def manager_turns(requests: list[tuple], embedder, cfg: ManagerConfig) -> list[ManagerTurn]:
    """One ManagerTurn per (bank, call), a call being banks.stream_groups' dict (facts, speaker,
    timestamp, dia_ids), with every fact embedded in one call."""
    flat = [f for _, call in requests for f in call["facts"]]
    vectors = embedder.embed(flat) if flat else []
    turns, row = [], 0
    for bank, call in requests:
        facts, speaker, timestamp = call["facts"], call["speaker"], call["timestamp"]
        shown = memories_for_facts(bank, vectors[row:row + len(facts)], cfg.top_k, speaker=speaker)
        row += len(facts)
        turns.append(ManagerTurn(list(facts), speaker, timestamp,
                                 build_manager_prompt(facts, shown, speaker, timestamp, cfg.list_unchanged),
                                 tuple(call.get("dia_ids", ()))))
    return turns


def decide(pairs: list[tuple[ManagerTurn, object]], embedder, cfg: ManagerConfig) -> list[ManagerOutcome]:
    """Parse each (turn, completion) into ops; the texts of every ADD and UPDATE are embedded in one call."""
    parsed = []
    for turn, completion in pairs:
        text = getattr(completion, "text", completion)
        parsed.append(parse_manager_output(text if isinstance(text, str) else "", len(turn.prompt.bank_ids), cfg,
                                           turn.prompt.shown_texts))
    texts = [op.text for ops, _ in parsed for op in ops if op.event in ("ADD", "UPDATE")]
    vectors = iter(embedder.embed(texts)) if texts else iter(())
    outcomes = []
    for (turn, completion), (ops, diag) in zip(pairs, parsed):
        need = [next(vectors) for op in ops if op.event in ("ADD", "UPDATE")]
        store = to_store_ops(ops, turn.prompt.bank_ids, need, turn.speaker, turn.timestamp, turn.sources)
        outcomes.append(ManagerOutcome(
            status=diag.status, parsed=diag.parsed, events=[op.event for op in ops],
            invalid_ops=diag.invalid_items + diag.duplicate_ids + len(diag.hallucinated_ids),
            truncated=hit_cap(completion), error=diag.error, store_ops=store,
            refs=[{"event": op.event, "local_id": op.reply_id, "old_memory": op.old_memory} for op in ops
                  if op.event != "ADD"]))
    return outcomes


def apply_outcomes(bank, outcomes: list[ManagerOutcome]) -> None:
    """Apply outcomes to one bank, all in one all-or-nothing batch. If the bank refuses the batch, each
    outcome is tried alone: the ones it refuses change nothing and become `bank_rejected`."""
    live = [o for o in outcomes if o.store_ops]
    try:
        bank.apply_batch([op for o in live for op in o.store_ops])
        for o in live:
            o.applied = True
        return
    except BankError:
        if len(live) == 1:
            _reject(live[0], "the bank refused the ops")
            return
    for o in live:
        try:
            bank.apply_batch(o.store_ops)
            o.applied = True
        except BankError as e:
            _reject(o, str(e))


def _reject(o: ManagerOutcome, error: str) -> None:
    o.status, o.applied, o.error = "bank_rejected", False, error[:200]
    o.invalid_ops += len(o.store_ops)


# ---- the answer turn ----
@dataclass
class AnswerRequest:
    bank: object
    question: str
    speakers: tuple[str, ...]
    search_s: float = 0.0        # filled by answer_prompts: the retrieval's wall time
    memories: dict = field(default_factory=dict)   # speaker -> the (id, text, timestamp) rows shown
    messages: list = field(default_factory=list)

    @property
    def shown(self) -> int:
        return sum(len(m) for m in self.memories.values())


def answer_prompts(requests: list[AnswerRequest], embedder, cfg: AnswerConfig) -> list[list[dict]]:
    """The chat prompt of each request: its question and the top-k memories of each speaker from its
    bank. Every distinct question is embedded once, all in one call (G forks share their questions).
    The top-k are listed in id order (ids grow with each ADD and survive UPDATE), not by score: the
    prompt reads in time order, and questions that retrieve the same memories share their prompt up to
    the question, which vLLM's prefix cache then computes once."""
    unique = list(dict.fromkeys(r.question for r in requests))
    row = {q: v for q, v in zip(unique, embedder.embed(unique) if unique else [])}
    for r in requests:
        v = row[r.question]
        t0 = time.perf_counter()
        r.memories = {s: sorted(r.bank.items_for_prompt(vector=v, k=cfg.top_k_per_speaker, speaker=s))
                      for s in r.speakers}
        r.search_s = time.perf_counter() - t0
        r.messages = build_answer_messages(r.question, r.memories, cfg)
    return [r.messages for r in requests]
