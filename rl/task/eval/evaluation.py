"""Evaluation: build each conversation's memory bank, answer every question of a split, and score.

`evaluate()` takes generators and an embedder (the protocols of memr1.rl.task.agents and memory_store),
so it runs the same on vLLM, transformers, an OpenAI-compatible endpoint or a scripted fake. Banks
are built with rl/task/banks.py and questions answered with rl/task/turns.py, the same turns training uses.

Baselines (`EvalConfig.baseline`):
- memr1: extraction + Memory Manager build the banks, the Answer Agent answers (the given models).
- base: the same pipeline on the untrained model (a Mem0-style pipeline); the caller picks the model.
- oracle: the synthetic oracle's banks, so the answer agent is scored apart from the manager.
- rag: every raw turn is a memory; retrieve top-k per speaker and answer (LoCoMo's RAG baseline).
  Turns over a memory's size are split, turns without a speaker left out (rl/task/rag.py); the report's
  `input` counts both.
- full_context: the whole conversation in the prompt; a conversation that does not fit the context
  is skipped with its reason, and its questions are reported as skipped, not scored.
Every role's completions that hit their token budget are counted (`capped`), per role.
"""
import time
from pathlib import Path
from typing import Annotated

import msgspec
from msgspec import Meta
from tqdm import tqdm

from memr1.rl.task.agents.answer import AnswerConfig, parse_answer
from memr1.rl.task.agents.manager import ManagerConfig
from memr1.rl.task.banks import generate_all, limit_turns, run_manager, safe_name, text_of
from memr1.rl.task.facts import facts_for
from memr1.rl.task.data.locomo import CATEGORY_NAMES
from memr1.rl.task.eval.scoring import aggregate, format_table, oracle_scores, percentiles, summarize_oracle
from memr1.rl.task.evidence import evidence_misses, fact_turns_of, miss_rate, stored_turns
from memr1.rl.generation import SamplingConfig, hit_cap
from memr1.rl.task.train_items import oracle_bank
from memr1.rl.task.rag import fact_bank, input_counts, rag_bank
from memr1.rl.task.rewards import score_answer
from memr1.rl.task.turns import AnswerRequest, Task, answer_prompts

BASELINES = ("memr1", "base", "oracle", "rag", "add_all", "full_context")
ROLES = ("extract", "manager", "answer")

FULL_CONTEXT_SYSTEM = """You answer a question about a conversation between two people, shown in
full with the date of each session. Reply with one line, "Answer: <answer>", in at most 5 or 6
words. Turn relative dates into absolute dates using the session's date."""


class EvalConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    baseline: str = "memr1"            # memr1 | base | oracle | rag | add_all (every fact ADDed) | full_context
    max_turns: Annotated[int, Meta(ge=0, le=10_000_000)] = 0   # per conversation, 0 = all (smoke runs)
    max_questions: Annotated[int, Meta(ge=0, le=10_000_000)] = 0   # per conversation, 0 = all (smoke runs)
    fact_match_f1: Annotated[float, Meta(gt=0, le=1)] = 0.5   # oracle fact matching threshold (see eval_report)
    resamples: Annotated[int, Meta(ge=1, le=1_000_000)] = 2000   # bootstrap resamples of paired comparisons (rl/task/eval/stats.py)
    progress: bool = True

    def __post_init__(self):
        if self.baseline not in BASELINES:
            raise ValueError(f"eval.baseline must be one of {BASELINES}, got {self.baseline!r}")


def evaluate(conversations: list, split: str, generator, embedder, cfg: EvalConfig, *, task: Task = Task(),
             cache_dir: str | Path, facts_dir: str | Path | None = None, model_id: str = "", judge=None,
             count_tokens=None, context_limit: int | None = None, bank_overrides: dict | None = None,
             batch_size: int = 64) -> dict:
    """Run one split and return the report (a JSON-ready dict; `format_table(report["metrics"])`).

    `generator` is one Generator for every role, or a dict role -> Generator for ROLES; `cache_dir` the
    folder for this (data, model, config)'s banks and `facts_dir` for its extractions (default:
    cache_dir); `judge` an rl.task.eval.judging.Judge for J or None; `count_tokens(messages)` and `context_limit`
    gate full_context prompts; `batch_size` prompts go in each generate call."""
    builds: dict = {}   # filled by bank building; its banks are closed however the run ends
    try:
        gens = generator if isinstance(generator, dict) else dict.fromkeys(ROLES, generator)
        missing = [r for r in ROLES if r not in gens]
        if missing:
            raise ValueError(f"evaluate: no generator for role(s) {missing}")
        return _evaluate(conversations, split, gens, embedder, cfg, task, Path(cache_dir), Path(facts_dir or cache_dir),
                         model_id, judge, count_tokens, context_limit, bank_overrides or {}, builds, batch_size)
    finally:
        for b in builds.values():
            b.bank.close()


def _evaluate(conversations, split, gens, embedder, cfg, task, cache_dir, facts_dir, model_id, judge, count_tokens,
              context_limit, bank_overrides, builds, batch_size) -> dict:
    if not conversations:
        raise ValueError(f"evaluate: no conversations in split {split!r}")
    if cfg.baseline == "full_context" and (count_tokens is None or not context_limit):
        raise ValueError("evaluate: baseline full_context needs count_tokens and context_limit")
    t_start = time.perf_counter()
    lat = {"manager": [], "search": [], "answer": []}
    counts = {role: {"calls": 0, "capped": 0} for role in ROLES}
    bar = lambda desc: tqdm(desc=desc, total=0, unit="prompt", disable=not cfg.progress, dynamic_ncols=True)

    banks, skipped, contexts, facts = {}, [], {}, {}
    if cfg.baseline in ("memr1", "base", "add_all"):
        with bar("extract facts") as b:
            facts = facts_for(conversations, gens["extract"], task.extract,
                              {c.sample_id: facts_dir / safe_name(c.sample_id) for c in conversations},
                              batch_size, cfg.max_turns, b, counts["extract"])
    if cfg.baseline == "add_all":
        banks = {c.sample_id: fact_bank(limit_turns(c, cfg.max_turns), facts[c.sample_id], embedder)
                 for c in conversations}
    elif cfg.baseline in ("memr1", "base"):
        with bar("manager steps") as b:
            builds.update(run_manager(conversations, {c.sample_id: cache_dir / safe_name(c.sample_id)
                                                      for c in conversations}, facts, gens["manager"], embedder,
                                      task.manager, batch_size=batch_size, max_turns=cfg.max_turns,
                                      bank_overrides=bank_overrides, latencies=lat["manager"], bar=b,
                                      counts=counts["manager"]))
        banks = {sid: build.bank for sid, build in builds.items()}
    elif cfg.baseline == "oracle":
        banks = {c.sample_id: oracle_bank(None, c, embedder) for c in conversations}
    elif cfg.baseline == "rag":
        banks = {c.sample_id: rag_bank(c, embedder, limit_turns(c, cfg.max_turns)) for c in conversations}
    else:
        contexts, skipped = full_contexts(conversations, cfg, count_tokens, context_limit, task.answer)

    # Every question of every conversation goes out in one batched pass.
    items, prompts = [], []
    for c in conversations:
        qs = questions_of(c, cfg)
        if cfg.baseline == "full_context":
            for q in qs if c.sample_id in contexts else []:
                items.append((c, q, 0))
                prompts.append([{"role": "system", "content": FULL_CONTEXT_SYSTEM},
                                {"role": "user", "content": f"{contexts[c.sample_id]}\n\nQuestion: {q.question}"}])
        else:
            requests = [AnswerRequest(banks[c.sample_id], q.question, (c.speaker_a, c.speaker_b)) for q in qs]
            prompts += answer_prompts(requests, embedder, task.answer)
            lat["search"] += [r.search_s for r in requests]
            items += [(c, q, r.shown) for q, r in zip(qs, requests)]
    outs = []
    if prompts:
        with tqdm(desc="answer", total=len(prompts), unit="q", disable=not cfg.progress, dynamic_ncols=True) as b:
            outs = generate_all(gens["answer"], prompts, SamplingConfig(temperature=0.0,
                                max_new_tokens=task.answer.max_new_tokens), batch_size, lat["answer"], b)
    counts["answer"] = {"calls": len(outs), "capped": sum(hit_cap(o) for o in outs)}
    records = []
    for (c, q, n_mem), out in zip(items, outs):
        parsed = parse_answer(text_of(out), task.answer)
        records.append({"sample_id": c.sample_id, "question": q.question, "gold": q.answer,
                        "prediction": parsed.answer, "category": q.category, **score_answer(parsed.answer, q.answer),
                        "has_answer_tag": parsed.has_answer_tag, "capped": hit_cap(out), "judge": None,
                        "memories_shown": n_mem})
    judge_info = run_judge(judge, records)

    misses = {c.sample_id: evidence_misses(stored_turns(banks[c.sample_id]), questions_of(c, cfg),
                                           fact_turns_of(c, facts.get(c.sample_id)))
              for c in conversations if c.sample_id in banks}
    oracle_parts = []
    for c in conversations:
        if c.oracle and c.sample_id in builds:
            b = builds[c.sample_id]
            limit = {t.dia_id for t in limit_turns(c, cfg.max_turns)} if cfg.max_turns else None
            oracle_parts.append(oracle_scores(c, b.steps, [m.text for m in b.bank], cfg.fact_match_f1, limit))
    return {
        "split": split, "baseline": cfg.baseline, "model": model_id,
        "n_conversations": len(conversations), "n_questions": len(records),
        "n_skipped_questions": sum(s["questions"] for s in skipped),
        "category_mapping": {"name": "mem0", **{str(k): v for k, v in CATEGORY_NAMES.items()}},
        "metrics": aggregate(records, judged=judge is not None),
        "capped": {role: {**n, "rate": n["capped"] / n["calls"] if n["calls"] else None} for role, n in counts.items()},
        "latency": {k: percentiles(v) for k, v in lat.items()},
        "latency_note": "batched: a prompt's latency is its generate call's wall time / prompts in the call; "
                        "search is per question (both speakers)",
        "judge": judge_info, "skipped": skipped, "input": turn_counts(conversations, cfg),
        "manager": summarize_manager(builds, task.manager),
        "oracle": summarize_oracle(oracle_parts),
        "evidence": {"miss_rate": miss_rate(list(misses.values())),
                     "per_conversation": {sid: {"missed": m, "counted": n} for sid, (m, n) in misses.items()},
                     "note": "rl/task/evidence.py: the share of questions whose needed evidence turns no memory came from"}
        if misses else None,
        "config": msgspec.to_builtins(cfg), "task": msgspec.to_builtins(task), "wall_s": time.perf_counter() - t_start,
        "answers": records,
    }


def turn_counts(conversations, cfg: EvalConfig) -> dict:
    """The turns read, and those the bank pipelines skip (no speaker) or, for rag, split (too long)."""
    counts = input_counts([t for c in conversations for t in limit_turns(c, cfg.max_turns)])
    if cfg.baseline != "rag":
        counts.pop("long_turns_split")
    if cfg.baseline in ("oracle", "full_context"):
        counts.pop("empty_speaker_skipped")
    return counts


def questions_of(conv, cfg: EvalConfig) -> list:
    return conv.qa[: cfg.max_questions] if cfg.max_questions else list(conv.qa)


def full_contexts(conversations, cfg: EvalConfig, count_tokens, context_limit: int, answer: AnswerConfig):
    """sample_id -> the conversation as text, for those that fit; the others as skip records."""
    contexts, skipped = {}, []
    for c in conversations:
        text = conversation_text(c, cfg)
        probe = [{"role": "system", "content": FULL_CONTEXT_SYSTEM},
                 {"role": "user", "content": f"{text}\n\nQuestion: ?"}]
        need = count_tokens(probe) + 32 + answer.max_new_tokens   # 32: room for the question
        if need > context_limit:
            skipped.append({"sample_id": c.sample_id, "questions": len(questions_of(c, cfg)),
                            "reason": f"the conversation needs about {need} tokens with the question and "
                                      f"answer; the context holds {context_limit}"})
        else:
            contexts[c.sample_id] = text
    return contexts, skipped


def run_judge(judge, records: list[dict]) -> dict:
    """Labels each record's "judge" CORRECT / WRONG / FAILED (retried first); a no-op without a judge."""
    info = {"kind": judge.cfg.kind if judge is not None else "off", "calls": 0, "n_failed": 0, "errors": []}
    if judge is None or not records:
        return info
    rep = judge.label([(r["question"], r["gold"], r["prediction"]) for r in records])
    for r, label in zip(records, rep.labels):
        r["judge"] = label
    info.update(calls=rep.calls, n_failed=rep.n_failed, errors=rep.errors[:20])
    return info


def conversation_text(conv, cfg: EvalConfig) -> str:
    keep = {t.dia_id for t in limit_turns(conv, cfg.max_turns)}
    parts = []
    for s in conv.sessions:
        lines = [f"{t.speaker}: {t.text}" for t in s.turns if t.dia_id in keep]
        if lines:
            parts.append(f"Session {s.index} ({s.date_time}):\n" + "\n".join(lines))
    return "\n\n".join(parts)


def summarize_manager(builds: dict, cfg: ManagerConfig) -> dict | None:
    if not builds:
        return None
    groups = [g for b in builds.values() for s in b.steps for g in s.get("groups", [])]
    events = {e: sum(g["events"].count(e) for g in groups) for e in ("ADD", "UPDATE", "DELETE", "NONE")}
    status = {}
    for g in groups:
        status[g["status"]] = status.get(g["status"], 0) + 1
    return {"turns_per_call": cfg.turns_per_call, "calls": len(groups), "events": events,
            "status": status, "recovered_steps": sum(bool(s.get("recovered")) for b in builds.values() for s in b.steps),
            "final_memories": {sid: len(b.bank) for sid, b in builds.items()}}


def write_report(report: dict, path: str | Path) -> Path:
    import json
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(path)
    return path


def table(report: dict) -> str:
    title = (f"{report['baseline']} on {report['split']} ({report['n_conversations']} conversations, "
             f"{report['n_questions']} questions; F1 / BLEU-1 / J in %, Mem0 categories)")
    capped = ", ".join(f"{role} {n['capped']}/{n['calls']}" for role, n in report["capped"].items() if n["calls"])
    ev = report.get("evidence") or {}
    miss = f"\nevidence miss: {100 * ev['miss_rate']:.1f}% of questions" if ev.get("miss_rate") is not None else ""
    return format_table(report["metrics"], title) + (f"\nhit the token budget: {capped}" if capped else "") + miss
