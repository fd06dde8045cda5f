"""Bank building: the Memory Manager over each conversation's per-turn facts (rl/task/facts.py) in order,
batched across conversations, with an on-disk cache that an interrupted build resumes from. Evaluation, stage-2
banks and the manager-built banks of stage-1 items all build through `run_manager`, whose calls are
the manager turns of rl/task/turns.py.

Batching. The manager is sequential, but only per *stream*: one speaker of one
conversation (the manager sees and touches only its speaker's memories, see rl/task/turns.py). Each step
sends one call per unfinished stream in one `generate` call; a call holds the facts of up to
`manager.turns_per_call` consecutive turns of its speaker within one session (`stream_groups`).

Cache layout (folders are named by `safe_name(sample_id)`, never by the raw id):
    <facts>/<name>/facts.json      extraction results, once all turns are extracted (until then,
                                   facts.partial.jsonl holds each finished batch's turns)
    <banks>/<name>/bank/           the MemoryBank in its durable on-disk format
    <banks>/<name>/progress.jsonl  one line per manager step applied: step, bank op count, calls
Both hold meta.json, the conversation's content digest (a mismatch rebuilds). A step's ops go to the
bank in one all-or-nothing batch, then its progress line is appended; if a crash falls between the
two, the bank's op count is ahead of the last line, and on restart that step counts as done.
"""
import hashlib
import json
import re
import shutil
import time
from pathlib import Path

import msgspec

from memr1.memory_store import MemoryBank
from memr1.rl.task.agents.manager import ManagerConfig
from memr1.rl.fileio import write_atomic
from memr1.rl.generation import SamplingConfig, hit_cap
from memr1.rl.task.turns import apply_outcomes, decide, manager_turns


def conversation_digest(conv) -> str:
    return hashlib.sha256(msgspec.json.encode(conv)).hexdigest()[:16]


def safe_name(sample_id: str) -> str:
    """A folder name for a conversation: its id's safe characters plus a digest of the whole id, so
    "../../x" or an absolute path can never leave the cache folder."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", str(sample_id))[:48].strip(".") or "conv"
    return f"{stem}-{hashlib.sha256(str(sample_id).encode()).hexdigest()[:8]}"


def generate_all(generator, prompts: list, sampling: SamplingConfig, batch_size: int,
                 latencies: list | None = None, bar=None) -> list:
    """The first completion of each prompt, `batch_size` prompts per generate call. Each prompt's
    latency is the call's wall time divided by the prompts in it (batching has no per-prompt time)."""
    outs = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        t0 = time.perf_counter()
        got = generator.generate(chunk, 1, sampling)
        if latencies is not None:
            latencies.extend([(time.perf_counter() - t0) / len(chunk)] * len(chunk))
        outs += [o[0] if o else None for o in got]
        if bar is not None:
            bar.update(len(chunk))
    return outs


def text_of(completion) -> str:
    return (getattr(completion, "text", "") or "") if completion is not None else ""


def limit_turns(conv, max_turns: int = 0) -> list:
    turns = conv.turns()
    return turns[:max_turns] if max_turns else turns


def count_capped(counts: dict | None, outs: list) -> None:
    if counts is not None:
        counts["calls"] = counts.get("calls", 0) + len(outs)
        counts["capped"] = counts.get("capped", 0) + sum(hit_cap(o) for o in outs)


# ---- the manager ----
def stream_groups(turns: list, facts: list[list[str]], turns_per_call: int) -> dict[str, list[dict]]:
    """speaker -> that speaker's manager calls in order; each groups up to `turns_per_call` consecutive
    fact-bearing turns of the speaker from one session."""
    groups: dict[str, list[dict]] = {}
    for turn, turn_facts in zip(turns, facts):
        if not turn_facts or not turn.speaker.strip():   # no speaker: no stream to remember it in
            continue
        session = turn.dia_id.split(":")[0]
        mine = groups.setdefault(turn.speaker, [])
        last = mine[-1] if mine else None
        if last and last["session"] == session and len(last["dia_ids"]) < turns_per_call:
            last["dia_ids"].append(turn.dia_id)
            last["facts"] += [f for f in turn_facts if f not in last["facts"]]
        else:
            mine.append({"speaker": turn.speaker, "session": session, "timestamp": turn.timestamp,
                         "dia_ids": [turn.dia_id], "facts": list(turn_facts)})
    return groups


class BankBuild(msgspec.Struct):
    """One conversation's bank and the manager's record of how it was built."""
    bank: MemoryBank
    steps: list[dict]           # progress lines: {"step", "lsn", "groups": [...], "recovered"?}
    groups: dict[str, list[dict]]


def prepare_dir(conv, folder: Path) -> None:
    """Keep a conversation's cache folder only if it was built from the same conversation content."""
    digest = conversation_digest(conv)
    meta = folder / "meta.json"
    if meta.is_file() and json.loads(meta.read_text()).get("digest") != digest:
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if not meta.is_file():
        shutil.rmtree(folder / "bank", ignore_errors=True)   # leftovers without a digest are not trusted
        for stale in ("progress.jsonl", "facts.json", "facts.partial.jsonl"):
            (folder / stale).unlink(missing_ok=True)
        write_atomic(meta, json.dumps({"sample_id": conv.sample_id, "digest": digest}))


def open_build(folder: Path | None, dim: int, bank_overrides: dict) -> tuple[MemoryBank, list[dict]]:
    """The cached bank and its progress, or a fresh bank (in memory when `folder` is None)."""
    if folder is None:
        return MemoryBank.create(None, dim=dim), []
    if (folder / "bank" / "MANIFEST.json").is_file():
        bank = MemoryBank.open(folder / "bank", "rw")
    else:
        shutil.rmtree(folder / "bank", ignore_errors=True)
        bank = MemoryBank.create(folder / "bank", dim=dim, **bank_overrides)
    steps = []
    log = folder / "progress.jsonl"
    if log.is_file():
        lines = log.read_text().splitlines()
        for line in lines:
            try:
                steps.append(json.loads(line))
            except json.JSONDecodeError:
                break   # a torn last line from a crash; that step is judged by the op count below
        if len(steps) < len(lines):
            write_atomic(log, "".join(json.dumps(s) + "\n" for s in steps))
    ops = bank.stats()["ops"]
    if ops > (steps[-1]["lsn"] if steps else 0):
        steps.append({"step": len(steps), "lsn": ops, "groups": [], "recovered": True})
        _append(log, steps[-1])
    return bank, steps


def run_manager(convs, dirs: dict | None, facts: dict, generator, embedder, cfg: ManagerConfig, *,
                batch_size: int = 64, max_turns: int = 0, bank_overrides: dict | None = None,
                latencies: list | None = None, bar=None, counts: dict | None = None) -> dict[str, BankBuild]:
    """Build (or resume) each conversation's bank from its per-turn facts, greedily. `dirs`: sample_id
    -> cache folder, or None for in-memory banks. `counts` receives {"calls", "capped"}."""
    builds = {}
    try:
        for conv in convs:
            folder = dirs[conv.sample_id] if dirs is not None else None
            if folder is not None:
                prepare_dir(conv, folder)
            bank, steps = open_build(folder, embedder.dim, bank_overrides or {})
            turns = limit_turns(conv, max_turns)
            builds[conv.sample_id] = BankBuild(bank, steps, stream_groups(turns, facts[conv.sample_id],
                                                                          cfg.turns_per_call))
        _manager_steps(builds, dirs, generator, embedder, cfg, batch_size, latencies, bar, counts)
        return builds
    except BaseException:   # interrupted: release the banks' writer locks; the cache keeps the progress
        for b in builds.values():
            b.bank.close()
        raise


def _manager_steps(builds, dirs, generator, embedder, cfg, batch_size, latencies, bar, counts) -> None:
    if bar is not None:
        bar.total = sum(len(g) for b in builds.values() for g in b.groups.values())
        bar.update(sum(min(len(b.steps), len(g)) for b in builds.values() for g in b.groups.values()))
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=cfg.max_new_tokens)
    while True:
        work = [(sid, g) for sid, b in builds.items() for speaker, groups in b.groups.items()
                if len(b.steps) < len(groups) for g in [groups[len(b.steps)]]]
        if not work:
            return
        turns = manager_turns([(builds[sid].bank, g)
                               for sid, g in work], embedder, cfg)
        outs = generate_all(generator, [t.prompt.messages for t in turns], sampling, batch_size, latencies, bar)
        count_capped(counts, outs)
        outcomes = decide(list(zip(turns, outs)), embedder, cfg)
        by_conv: dict[str, list] = {}
        for (sid, g), turn, outcome in zip(work, turns, outcomes):
            by_conv.setdefault(sid, []).append((turn, g, outcome))
        for sid, calls in by_conv.items():
            b = builds[sid]
            touched = [touched_memories(b.bank, o) for _, _, o in calls]   # read before the ops apply
            apply_outcomes(b.bank, [o for _, _, o in calls])
            records = [{"speaker": t.speaker, "dia_ids": g["dia_ids"], "n_facts": len(g["facts"]),
                        "events": o.events if o.applied or not o.store_ops else [], "status": o.status,
                        "truncated": o.truncated, "touched": tm if o.applied else [],
                        **({"error": o.error} if o.error else {})}
                       for (t, g, o), tm in zip(calls, touched)]
            line = {"step": len(b.steps), "lsn": b.bank.stats()["ops"], "groups": records}
            if dirs is not None:
                _append(dirs[sid] / "progress.jsonl", line)
            b.steps.append(line)


def touched_memories(bank, outcome) -> list[list[str]]:
    """[event, text of the memory it changes] of each UPDATE and DELETE of a manager outcome: which
    memory an op hit, for op accuracy that checks ids (rl/task/eval/scoring.py)."""
    from memr1.memory_store import Delete, Update

    out = []
    for op in outcome.store_ops:
        if isinstance(op, (Update, Delete)):
            text = bank.get(op.id).text if op.id in bank else ""
            out.append(["UPDATE" if isinstance(op, Update) else "DELETE", text])
    return out


def _append(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
