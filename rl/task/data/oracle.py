"""The synthetic set's `memr1_oracle` (the fact timeline and final facts), checked when a data file is
read: warm starts, oracle banks and the eval's oracle scores index it freely, so a malformed one must
stop at load as a DataError naming the conversation, not later as a KeyError deep in a stage."""
from typing import Literal

import msgspec

from memr1.rl.task.data.errors import DataError


class OracleEvent(msgspec.Struct, frozen=True):
    dia_id: str
    speaker: str
    slot: str
    event: Literal["ADD", "UPDATE", "DELETE", "NONE"]
    memory: str
    old_memory: str | None = None


class Oracle(msgspec.Struct, frozen=True):
    timeline: list[OracleEvent]
    final_facts: dict[str, str]


def check_oracle(raw, turn_ids: set[str], where: str):
    """`raw` (the JSON value) when it is a well-formed oracle of these turns, else a DataError."""
    if raw is None:
        return None
    try:
        oracle = msgspec.convert(raw, Oracle)
    except msgspec.ValidationError as e:
        raise DataError(f"{where}: memr1_oracle: {e}") from None
    unknown = [e.dia_id for e in oracle.timeline if e.event != "ADD" and e.old_memory is None]
    if unknown:
        raise DataError(f"{where}: memr1_oracle: a change without the old_memory it changes, at {unknown[:3]}")
    strays = [e.dia_id for e in oracle.timeline if e.dia_id not in turn_ids]
    if strays:
        raise DataError(f"{where}: memr1_oracle: timeline names turns the conversation lacks: {strays[:3]}")
    try:
        apply_oracle(raw["timeline"])   # every UPDATE and DELETE changes a memory the timeline holds
    except ValueError as e:
        raise DataError(f"{where}: memr1_oracle: {e}") from None
    return raw


def apply_oracle(timeline: list[dict]) -> dict[str, str]:
    """Replay the oracle ops on a plain dict (slot -> text), checking each op is legal."""
    state: dict[str, str] = {}
    for e in timeline:
        slot, event, old = e["slot"], e["event"], e.get("old_memory")
        if event == "ADD":
            if slot in state:
                raise ValueError(f"{e['dia_id']}: ADD to occupied slot {slot}")
            state[slot] = e["memory"]
        elif event in ("UPDATE", "DELETE", "NONE"):
            if state.get(slot) != old:
                raise ValueError(f"{e['dia_id']}: {event} expects {old!r} in {slot}, found {state.get(slot)!r}")
            if event == "UPDATE":
                state[slot] = e["memory"]
            elif event == "DELETE":
                del state[slot]
        else:
            raise ValueError(f"{e['dia_id']}: unknown event {event!r}")
    return state
