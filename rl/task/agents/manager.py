"""Memory Manager: prompt builder, tolerant parser, and conversion to memory_store operations.

The model sees the retrieved memories under SMALL LOCAL ids "0".."k-1" (copying a long bank id is a
common failure of small models); `ManagerPrompt.bank_ids[i]` maps local id i back to the bank. The
output schema is the paper's, `{"memory": [{"id", "text", "event", "old_memory"?}]}` with event ADD,
UPDATE, DELETE or NONE, with its items and keys in the order a small model can decide them: one item
per new fact, in order, that first copies the fact into "text" (an UPDATE's text is the memory's new
text, a DELETE's or NONE's the fact that decided it), then names the event, then copies the shown
memory the op concerns, then gives its id. Each decision then follows the text it is about: the event
follows the fact, compared against the memories listed above it, and the id is the token that follows
the memory text the reply has just copied, since each shown memory is listed text first and id
second. JSON key and item order carry no meaning to the parser.
`parse_manager_output` never raises on model output: it returns the valid ops plus
`ManagerDiagnostics` (parse failure, hallucinated ids, per-event counts); rewards live in rl/task/rewards.
A parse failure yields no ops, so the bank stays unchanged.
"""
import json
import re

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from memr1.rl.task.agents.jsonish import extract_json

EVENTS = ("ADD", "UPDATE", "DELETE", "NONE")
# Spellings small models use for the same events; anything else is an invalid item.
_EVENT_ALIASES = {"NOOP": "NONE", "NO_OP": "NONE", "NO-OP": "NONE", "NOTHING": "NONE", "KEEP": "NONE",
                  "INSERT": "ADD", "CREATE": "ADD", "MODIFY": "UPDATE", "EDIT": "UPDATE",
                  "REMOVE": "DELETE", "DEL": "DELETE"}

MANAGER_SYSTEM = """You keep a memory bank about the people in a conversation. You see one person's existing
memories (each with a short id) and new facts about them. Take the new facts in order, one item each:
copy the fact into "text", then decide its event.
- ADD: the bank does not hold it yet.
- UPDATE: it changes or adds detail to a memory. Copy that memory into "old_memory" and give its id;
  "text" is the memory as it should now read, the more detailed version.
- DELETE: it shows a memory is no longer true. Copy that memory into "old_memory" and give its id.
- NONE: a memory already says it, maybe in other words. Copy that memory into "old_memory" and give its id.
{listing} Use only ids you were shown. Reply with JSON only:
{example}"""
LIST_ALL = ("Then list each shown memory no fact concerns, with event NONE.",
            """{"memory": [{"text": "...", "event": "UPDATE", "old_memory": "...", "id": "1"},
            {"text": "...", "event": "ADD"},
            {"event": "NONE", "old_memory": "...", "id": "0"}]}""")
LIST_CHANGES = ("With no new facts, reply {\"memory\": []}.",
                """{"memory": [{"text": "...", "event": "UPDATE", "old_memory": "...", "id": "1"},
            {"text": "...", "event": "ADD"}]}""")


_SYSTEMS = {flag: MANAGER_SYSTEM.replace("{listing}", listing).replace("{example}", example)
            for flag, (listing, example) in ((True, LIST_ALL), (False, LIST_CHANGES))}


def manager_system(list_unchanged: bool) -> str:
    return _SYSTEMS[bool(list_unchanged)]


class ManagerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The manager's task settings, the same in training rollouts, bank building and evaluation."""
    top_k: Annotated[int, Meta(ge=1, le=1000)] = 10   # memories of the speaker retrieved and shown to the manager
    turns_per_call: Annotated[int, Meta(ge=1, le=1000)] = 1   # facts of up to this many consecutive turns of a speaker (one
                                        # session) per call; training items are cut the same way
    max_new_tokens: Annotated[int, Meta(ge=1, le=65_536)] = 2048   # the completion budget of every manager call (the paper's cap)
    max_ops: Annotated[int, Meta(ge=1, le=10_000)] = 64   # ops after this many are ignored (runaway completions)
    list_unchanged: bool = True         # the paper's output lists every shown memory (NONE included);
                                        # false: only the changes and the ADDs (a shorter reply)
    max_text_chars: Annotated[int, Meta(ge=1, le=100_000)] = 500
    # Which memory an UPDATE, DELETE or NONE concerns: "id", the shown id it gives (the paper's); "text",
    # the shown memory whose text its old_memory copies (trimmed, case-folded), the id breaking ties and
    # standing in when the text matches none. Memory systems address memories by content too.
    resolve: Literal["id", "text"] = "id"


class ManagerPrompt(msgspec.Struct, frozen=True):
    messages: list[dict]
    bank_ids: list[int]   # local id i (as shown to the model) -> bank id
    shown_texts: list[str] = []   # local id i -> the memory's text as shown


class ManagerOp(msgspec.Struct, frozen=True):
    event: str                   # ADD / UPDATE / DELETE / NONE
    local_id: int | None         # the shown memory it concerns (ManagerConfig.resolve); None for ADD
    text: str = ""
    old_memory: str | None = None
    # set only where resolve = "text" moved the op off the id the reply gave: that id (-1: none that names
    # a shown memory); the rollout records what the reply said (ManagerOp.reply_id)
    given_id: int | None = None

    @property
    def reply_id(self) -> int | None:
        """The shown id the reply gave, None when it gave none naming a shown memory (or for an ADD)."""
        return self.local_id if self.given_id is None else (None if self.given_id < 0 else self.given_id)


class ManagerDiagnostics(msgspec.Struct):
    parsed: bool
    error: str = ""
    counts: dict[str, int] = msgspec.field(default_factory=lambda: dict.fromkeys(EVENTS, 0))
    hallucinated_ids: list[str] = msgspec.field(default_factory=list)
    invalid_items: int = 0        # not an object, unknown event, or missing text
    duplicate_ids: int = 0        # a second op on one id (dropped: the first op wins)

    @property
    def status(self) -> str:
        """One label per completion, for logging: the worst thing that happened."""
        if not self.parsed:
            return "parse_error"
        if self.hallucinated_ids:
            return "hallucinated_id"
        if self.invalid_items or self.duplicate_ids:
            return "invalid_item"
        return "ok"


def build_manager_prompt(facts: list[str], memories: list[tuple[int, str, str]], speaker: str = "",
                         date_time: str = "", list_unchanged: bool = True) -> ManagerPrompt:
    """`memories` are (bank_id, text, timestamp), e.g. from `MemoryBank.items_for_prompt`."""
    if not isinstance(facts, list) or not all(isinstance(f, str) for f in facts):
        raise TypeError("build_manager_prompt: facts must be a list of str")
    try:
        bank_ids = [int(m[0]) for m in memories]
        shown = [{"text": str(m[1]), "id": str(i)} for i, m in enumerate(memories)]
    except (TypeError, ValueError, IndexError) as e:
        raise TypeError(f"build_manager_prompt: memories must be (id, text, timestamp) tuples ({e})") from None
    header = f"New facts from {speaker or 'the conversation'}" + (f" ({date_time})" if date_time else "")
    user = (f"Existing memories:\n{json.dumps(shown, ensure_ascii=False)}\n\n"
            f"{header}:\n{json.dumps(facts, ensure_ascii=False)}")
    return ManagerPrompt(messages=[{"role": "system", "content": manager_system(list_unchanged)},
                                   {"role": "user", "content": user}], bank_ids=bank_ids,
                         shown_texts=[m["text"] for m in shown])


def reply_item(event: str, local_id: int | None = None, text: str = "", old_memory: str | None = None) -> dict:
    """One op as the prompt's example writes it (the module doc's key order); what warm starts imitate.
    `text` is the fact the item is about (for an ADD or UPDATE, the memory's new text); an item without
    one is a shown memory no fact concerns."""
    item = {"text": text} if text else {}
    item["event"] = event
    if event != "ADD":
        item["old_memory"] = old_memory or ""
        item["id"] = str(local_id)
    return item


def _local_id(raw, n_shown: int) -> int | None:
    """The shown id an item refers to, or None when it names anything else."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, str) and re.fullmatch(r"-?[0-9]{1,9}", raw.strip()):  # ASCII digits only: "²" and
        raw = int(raw.strip())                                                  # "--1" are not ids
    if isinstance(raw, float) and raw.is_integer():
        raw = int(raw)
    return raw if isinstance(raw, int) and 0 <= raw < n_shown else None


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


def by_text(old: str | None, given: int | None, shown_texts: list[str]) -> int | None:
    """resolve = "text": the shown memory whose text `old` copies (the given id among several that match,
    else the first), or the given id when none matches."""
    if old is None:
        return given
    key = _norm(old)
    matches = [i for i, t in enumerate(shown_texts) if _norm(t) == key]
    return given if not matches or given in matches else matches[0]


def parse_manager_output(output, n_shown: int, cfg: ManagerConfig = ManagerConfig(), shown_texts: list[str] | None = None
                         ) -> tuple[list[ManagerOp], ManagerDiagnostics]:
    """Ops from a completion, never raising. `n_shown` is len(prompt.bank_ids); `shown_texts`
    (ManagerPrompt.shown_texts) lets resolve = "text" read which memory an op's old_memory copies."""
    value, err = extract_json(output)
    if isinstance(value, dict):
        items = next((value[k] for k in ("memory", "memories", "operations") if k in value), None)
        if not isinstance(items, list):
            items, err = None, "JSON object has no 'memory' list"
    else:
        items = value if isinstance(value, list) else None
    if items is None:
        return [], ManagerDiagnostics(parsed=False, error=err or "no JSON found")

    diag = ManagerDiagnostics(parsed=True)
    ops, used = [], set()
    for item in items[: cfg.max_ops]:
        if not isinstance(item, dict):
            diag.invalid_items += 1
            continue
        event = str(item.get("event", "")).strip().upper()
        event = _EVENT_ALIASES.get(event, event)
        text = item.get("text", "")
        text = text.strip()[: cfg.max_text_chars] if isinstance(text, str) else ""
        old = item.get("old_memory")
        old = old if isinstance(old, str) else None
        if event not in EVENTS or (event in ("ADD", "UPDATE") and not text):
            diag.invalid_items += 1
            continue
        local = given = None
        if event != "ADD":
            local = given = _local_id(item.get("id"), n_shown)
            if cfg.resolve == "text" and shown_texts is not None:
                local = by_text(old, given, shown_texts[:n_shown])
            if local is None:
                diag.hallucinated_ids.append(str(item.get("id"))[:40])
                continue
            if local in used:
                diag.duplicate_ids += 1
                continue
            used.add(local)
        diag.counts[event] += 1
        moved = None if local == given else (-1 if given is None else given)
        ops.append(ManagerOp(event=event, local_id=local, text=text, old_memory=old, given_id=moved))
    return ops, diag


def to_store_ops(ops: list[ManagerOp], bank_ids: list[int], vectors, speaker: str, timestamp: str = "",
                 sources: tuple[str, ...] = ()):
    """memory_store operations for `bank.apply_batch`; `vectors` holds one embedding per ADD / UPDATE op,
    in order (the caller embeds many completions' texts in one call). NONE ops are dropped. `sources`:
    the call's dialogue turn ids, recorded on what its ADDs and UPDATEs write (evidence recall)."""
    # Imported here so prompts and parsers work without the native bank (e.g. in eval tooling).
    from memr1.memory_store import Add, Delete, Update

    out, row = [], 0
    for op in ops:
        if op.event == "ADD":
            out.append(Add(text=op.text, vector=vectors[row], speaker=speaker, timestamp=timestamp, sources=sources))
        elif op.event == "UPDATE":
            out.append(Update(id=bank_ids[op.local_id], text=op.text, vector=vectors[row],
                              timestamp=timestamp or None, sources=sources))
        elif op.event == "DELETE":
            out.append(Delete(id=bank_ids[op.local_id]))
        row += op.event in ("ADD", "UPDATE")
    return out


def memories_for_facts(bank, fact_vectors, k: int, speaker: str | None = None) -> list[tuple[int, str, str]]:
    """Up to k distinct memories relevant to any of the facts: the facts' search results merged
    round-robin (best of each fact first). `fact_vectors` come from one batched embedder call."""
    per_fact = [bank.items_for_prompt(vector=v, k=k, speaker=speaker) for v in fact_vectors]
    merged, seen = [], set()
    for rank in range(k):
        for results in per_fact:
            if rank < len(results) and results[rank][0] not in seen:
                seen.add(results[rank][0])
                merged.append(results[rank])
    return merged[:k]
