"""Per-turn facts of each conversation: the synthetic oracle's, or extracted by a model (the first role
of Memory-R1's pipeline). Extraction does not read the bank, so every turn of every conversation is
extracted up front in large batches; each finished batch is appended to the conversation's
facts.partial.jsonl, so an interrupted run redoes at most one batch (cache layout: rl/task/banks.py).
"""
import json
from pathlib import Path

from memr1.rl.task.agents.extract import ExtractConfig, build_extract_messages, grounded, parse_facts
from memr1.rl.task.banks import count_capped, generate_all, limit_turns, prepare_dir, text_of
from memr1.rl.fileio import write_atomic
from memr1.rl.generation import SamplingConfig


def extract_all(convs, dirs: dict, generator, cfg: ExtractConfig, batch_size: int, max_turns: int = 0,
                bar=None, counts: dict | None = None) -> dict:
    """sample_id -> one fact list per turn (in `conv.turns()` order, cut to max_turns). Each batch's
    results are appended to facts.partial.jsonl, so a restart redoes at most one batch. `counts`
    receives {"calls", "capped"} (completions that hit the token budget)."""
    facts, todo, names = {}, [], {}
    for conv in convs:
        names[conv.sample_id] = sorted({t.speaker for t in conv.turns()})
        folder = dirs[conv.sample_id]
        prepare_dir(conv, folder)
        if (folder / "facts.json").is_file():
            facts[conv.sample_id] = json.loads((folder / "facts.json").read_text())
            continue
        turns = limit_turns(conv, max_turns)
        facts[conv.sample_id] = done = [None] * len(turns)
        for i, turn_facts in _read_partial(folder / "facts.partial.jsonl"):
            if i < len(done):
                done[i] = turn_facts
        for i, turn in enumerate(turns):
            if done[i] is None:
                ctx = [(t.speaker, t.text) for t in turns[max(0, i - cfg.context_turns):i]]
                todo.append((conv.sample_id, i, turn, ctx))
        _finish_if_complete(folder, done)
    if bar is not None:
        bar.total = len(todo)
        bar.refresh()
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=cfg.max_new_tokens)
    for start in range(0, len(todo), batch_size):
        chunk = todo[start:start + batch_size]
        prompts = [build_extract_messages(turn.speaker, turn.text, turn.timestamp, ctx) for _, _, turn, ctx in chunk]
        outs = generate_all(generator, prompts, sampling, len(chunk), bar=bar)
        count_capped(counts, outs)
        touched = {}
        for (sid, i, turn, ctx), out in zip(chunk, outs):
            found = parse_facts(text_of(out), cfg).facts
            said = " ".join([turn.text, *(t for _, t in ctx)])
            facts[sid][i] = grounded(found, said, names[sid]) if cfg.grounded else found
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
        write_atomic(folder / "facts.json", json.dumps(facts))
        (folder / "facts.partial.jsonl").unlink(missing_ok=True)


def oracle_facts(conv, max_turns: int = 0) -> list[list[str]]:
    """Per-turn facts from a synthetic conversation's ground-truth timeline: what a perfect extractor
    would return."""
    by_turn: dict[str, list[str]] = {}
    for e in conv.oracle["timeline"]:
        by_turn.setdefault(e["dia_id"], []).append(e["fact"])
    return [by_turn.get(t.dia_id, []) for t in limit_turns(conv, max_turns)]


def facts_for(convs, generator, extract: ExtractConfig, dirs: dict | None, batch_size: int = 64, max_turns: int = 0,
              bar=None, counts: dict | None = None) -> dict:
    """Per-turn facts of each conversation: extracted by `generator`, or the synthetic oracle's
    (`extract.source`). Training items, stage-2 banks and evaluation all take their facts from here."""
    if extract.source == "oracle":
        missing = [c.sample_id for c in convs if not c.oracle]
        if missing:
            raise ValueError(f"extract.source = 'oracle' needs synthetic data with an oracle; {missing[:3]} have none")
        return {c.sample_id: oracle_facts(c, max_turns) for c in convs}
    return extract_all(convs, dirs, generator, extract, batch_size, max_turns, bar, counts)
