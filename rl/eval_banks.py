"""Bank building for eval: fact extraction, then the Memory Manager over the turns in order, batched
across conversations, with an on-disk cache that an interrupted eval resumes from.

Batching. Extraction does not read the bank, so every turn of every conversation is extracted up
front in large batches. The manager is sequential, but only per *stream*: a stream is one speaker of
one conversation. The manager is shown (and may only touch) that speaker's memories, and its ADDs
are tagged with that speaker, so the two streams of a conversation never see each other's ops and
can advance together. Each step sends one prompt per unfinished stream in one `generate` call.
`manager_turns_per_call` > 1 puts the facts of that many consecutive turns of the stream's speaker
(within one session, so they share a date) into one call.

Cache layout: the caller picks folders keyed by a hash of model and config, one for extraction and
one for banks (they may be the same folder). Extraction has its own key because it is done by the
frozen base model: the base and trained evals of a run share it.
    <facts>/<sample_id>/facts.json      extraction results, once all turns are extracted (until then,
                                        facts.partial.jsonl holds each finished batch's turns)
    <banks>/<sample_id>/bank/           the MemoryBank in its durable on-disk format
    <banks>/<sample_id>/progress.jsonl  one line per manager step applied: step, bank op count, diagnostics
Both hold meta.json, the conversation's content digest (a mismatch rebuilds).
A step's ops go to the bank in one all-or-nothing `apply_batch`, then its progress line is appended.
If a crash falls between the two, the bank's op count is ahead of the last line, so on restart that
step is counted as done (its ops are in the bank) and marked recovered.
"""
import hashlib
import json
import shutil
import time
from pathlib import Path

import msgspec

from memr1.memory_store import Add, BankError, MemoryBank
from memr1.rl.agents.extract import ExtractConfig, build_extract_messages, parse_facts
from memr1.rl.agents.manager import (ManagerConfig, build_manager_prompt, memories_for_facts,
                                     parse_manager_output, to_store_ops)


def conversation_digest(conv) -> str:
    return hashlib.sha256(msgspec.json.encode(conv)).hexdigest()[:16]


def with_tokens(sampling, n: int):
    """The caller's (greedy) sampling settings with another max_new_tokens."""
    if isinstance(sampling, msgspec.Struct):
        return msgspec.structs.replace(sampling, max_new_tokens=n)
    return dict(sampling or {}, max_new_tokens=n, max_tokens=n)


def generate_texts(generator, prompts: list, sampling, batch_size: int, latencies: list | None = None,
                   bar=None) -> list[str]:
    """Greedy texts for many prompts, `batch_size` per generate call. Each prompt's latency is the
    call's wall time divided by the prompts in it (batched eval has no per-prompt wall time)."""
    texts = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        t0 = time.perf_counter()
        outs = generator.generate(chunk, 1, sampling)
        per = (time.perf_counter() - t0) / len(chunk)
        if latencies is not None:
            latencies.extend([per] * len(chunk))
        texts += [(getattr(o[0], "text", "") or "") if o else "" for o in outs]
        if bar is not None:
            bar.update(len(chunk))
    return texts


# ---- extraction ----
def extract_all(convs, dirs: dict, generator, sampling, cfg, extract_cfg: ExtractConfig, bar) -> dict:
    """sample_id -> one fact list per turn (in `conv.turns()` order, cut to cfg.max_turns). Each
    batch's results are appended to facts.partial.jsonl, so a restart redoes at most one batch."""
    facts, todo = {}, []
    for conv in convs:
        folder = dirs[conv.sample_id]
        prepare_dir(conv, folder)
        if (folder / "facts.json").is_file():
            facts[conv.sample_id] = json.loads((folder / "facts.json").read_text())
            continue
        turns = limit_turns(conv, cfg)
        facts[conv.sample_id] = done = [None] * len(turns)
        for i, turn_facts in _read_partial(folder / "facts.partial.jsonl"):
            if i < len(done):
                done[i] = turn_facts
        for i, turn in enumerate(turns):
            if done[i] is None:
                ctx = [(t.speaker, t.text) for t in turns[max(0, i - cfg.extract_context_turns):i]]
                todo.append((conv.sample_id, i, build_extract_messages(turn.speaker, turn.text, turn.timestamp, ctx)))
        _finish_if_complete(folder, done)
    bar.total = len(todo)
    bar.refresh()
    for start in range(0, len(todo), cfg.batch_size):
        chunk = todo[start:start + cfg.batch_size]
        texts = generate_texts(generator, [m for _, _, m in chunk], sampling, len(chunk), bar=bar)
        touched = {}
        for (sid, i, _), text in zip(chunk, texts):
            facts[sid][i] = parse_facts(text, extract_cfg).facts
            touched.setdefault(sid, []).append({"i": i, "facts": facts[sid][i]})
        for sid, lines in touched.items():
            with open(dirs[sid] / "facts.partial.jsonl", "a") as f:
                f.write("".join(json.dumps(line) + "\n" for line in lines))
            _finish_if_complete(dirs[sid], facts[sid])
    return facts


def _read_partial(path: Path):
    if not path.is_file():
        return
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
            yield int(rec["i"]), list(rec["facts"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            return   # a torn last line; its turns are extracted again


def _finish_if_complete(folder: Path, facts: list) -> None:
    if all(f is not None for f in facts):
        _write_atomic(folder / "facts.json", json.dumps(facts))
        (folder / "facts.partial.jsonl").unlink(missing_ok=True)


def limit_turns(conv, cfg) -> list:
    turns = conv.turns()
    return turns[: cfg.max_turns] if cfg.max_turns else turns


# ---- manager ----
def stream_groups(conv, facts: list[list[str]], cfg) -> dict[str, list[dict]]:
    """speaker -> that speaker's manager calls in order; each groups up to `manager_turns_per_call`
    consecutive fact-bearing turns of the speaker from one session."""
    turns = limit_turns(conv, cfg)
    groups: dict[str, list[dict]] = {}
    for turn, turn_facts in zip(turns, facts):
        if not turn_facts:
            continue
        session = turn.dia_id.split(":")[0]
        mine = groups.setdefault(turn.speaker, [])
        last = mine[-1] if mine else None
        if last and last["session"] == session and len(last["dia_ids"]) < cfg.manager_turns_per_call:
            last["dia_ids"].append(turn.dia_id)
            last["facts"] += [f for f in turn_facts if f not in last["facts"]]
        else:
            mine.append({"session": session, "timestamp": turn.timestamp, "dia_ids": [turn.dia_id],
                         "facts": list(turn_facts)})
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
        _write_atomic(meta, json.dumps({"sample_id": conv.sample_id, "digest": digest}))


def open_build(folder: Path, embedder, bank_overrides: dict) -> tuple[MemoryBank, list[dict]]:
    """The cached bank and its progress, or a fresh bank when there is none."""
    if (folder / "bank" / "MANIFEST.json").is_file():
        bank = MemoryBank.open(folder / "bank", "rw")
    else:
        shutil.rmtree(folder / "bank", ignore_errors=True)
        bank = MemoryBank.create(folder / "bank", dim=embedder.dim, **bank_overrides)
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
            _write_atomic(log, "".join(json.dumps(s) + "\n" for s in steps))
    ops = bank.stats()["ops"]
    if ops > (steps[-1]["lsn"] if steps else 0):
        steps.append({"step": len(steps), "lsn": ops, "groups": [], "recovered": True})
        _append(log, steps[-1])
    return bank, steps


def run_manager(convs, dirs: dict, facts: dict, generator, embedder, sampling, cfg,
                manager_cfg: ManagerConfig, bank_overrides: dict, latencies: list, bar) -> dict[str, BankBuild]:
    """Build (or resume) each conversation's bank in `dirs[sample_id]` from its per-turn facts."""
    builds = {}
    try:
        for conv in convs:
            prepare_dir(conv, dirs[conv.sample_id])
            bank, steps = open_build(dirs[conv.sample_id], embedder, bank_overrides)
            builds[conv.sample_id] = BankBuild(bank, steps, stream_groups(conv, facts[conv.sample_id], cfg))
        _manager_steps(builds, dirs, generator, embedder, sampling, cfg, manager_cfg, latencies, bar)
        return builds
    except BaseException:   # interrupted: release the banks' writer locks; the cache keeps the progress
        for b in builds.values():
            b.bank.close()
        raise


def _manager_steps(builds, dirs, generator, embedder, sampling, cfg, manager_cfg, latencies, bar) -> None:
    total = sum(len(g) for b in builds.values() for g in b.groups.values())
    bar.total = total
    bar.update(sum(min(len(b.steps), len(g)) for b in builds.values() for g in b.groups.values()))
    while True:
        work = []   # (sample_id, speaker, group, prompt)
        for sid, b in builds.items():
            step = len(b.steps)
            for speaker, groups in b.groups.items():
                if step < len(groups):
                    g = groups[step]
                    vecs = embedder.embed(g["facts"])
                    shown = memories_for_facts(b.bank, vecs, manager_cfg.top_k, speaker)
                    work.append((sid, speaker, g, build_manager_prompt(g["facts"], shown, speaker, g["timestamp"])))
        if not work:
            return
        texts = generate_texts(generator, [w[3].messages for w in work], sampling, cfg.batch_size, latencies, bar)
        by_conv: dict[str, list] = {}
        for (sid, speaker, g, prompt), text in zip(work, texts):
            ops, diag = parse_manager_output(text, len(prompt.bank_ids), manager_cfg)
            store_ops = to_store_ops(ops, prompt.bank_ids, embedder, speaker, g["timestamp"])
            record = {"speaker": speaker, "dia_ids": g["dia_ids"], "n_facts": len(g["facts"]),
                      "events": [op.event for op in ops], "status": diag.status}
            by_conv.setdefault(sid, []).append((store_ops, record))
        for sid, items in by_conv.items():
            b = builds[sid]
            try:
                b.bank.apply_batch([op for ops, _ in items for op in ops])
            except BankError:   # e.g. a text the bank refuses: keep the other stream's ops, drop this one's
                for ops, record in items:
                    try:
                        b.bank.apply_batch(ops)
                    except BankError as e:
                        record["status"], record["events"] = "bank_rejected", []
                        record["error"] = str(e)[:200]
            line = {"step": len(b.steps), "lsn": b.bank.stats()["ops"], "groups": [r for _, r in items]}
            _append(dirs[sid] / "progress.jsonl", line)
            b.steps.append(line)


def oracle_facts(conv, cfg) -> list[list[str]]:
    """Per-turn facts from a synthetic conversation's ground-truth timeline: what a perfect extractor
    would return, so a manager can be run without the cost of model extraction."""
    by_turn: dict[str, list[str]] = {}
    for e in conv.oracle["timeline"]:
        by_turn.setdefault(e["dia_id"], []).append(e["fact"])
    return [by_turn.get(t.dia_id, []) for t in limit_turns(conv, cfg)]


def rag_bank(conv, embedder, cfg) -> MemoryBank:
    """The LoCoMo RAG baseline's store: every raw turn is a memory of its speaker, dated by its session."""
    turns = [t for t in limit_turns(conv, cfg) if t.text.strip()]
    bank = MemoryBank.create(None, dim=embedder.dim)
    if turns:
        vecs = embedder.embed([f"{t.speaker}: {t.text}" for t in turns])
        bank.apply_batch([Add(text=f"{t.speaker}: {t.text}", vector=v, speaker=t.speaker, timestamp=t.timestamp)
                          for t, v in zip(turns, vecs)])
    return bank


def _append(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
