"""Evaluation: build each conversation's memory bank, answer every question of a split, and score.

`evaluate()` takes a generator and an embedder (the protocols of memr1.rl.agents and memory_store),
so it runs the same on vLLM, transformers, an OpenAI-compatible endpoint or a scripted fake. Bank
building (batched across conversations, cached, resumable) lives in `eval_banks`, and scoring and
the table in `eval_report`.

Baselines (`EvalConfig.baseline`):
- memr1: extraction + Memory Manager build the banks, the Answer Agent answers (the given model).
- base: the same pipeline on the untrained model (a Mem0-style pipeline); the caller picks the model.
- rag: every raw turn is a memory; retrieve top-k per speaker and answer (LoCoMo's RAG baseline).
- full_context: the whole conversation in the prompt; a conversation that does not fit the context
  is skipped with its reason, and its questions are reported as skipped, not scored.
"""
import json
import time
from pathlib import Path

import msgspec
from tqdm import tqdm

from memr1.rl.agents.answer import AnswerConfig, build_answer_messages, parse_answer
from memr1.rl.agents.extract import ExtractConfig
from memr1.rl.agents.manager import ManagerConfig
from memr1.rl.data.locomo import CATEGORY_NAMES
from memr1.rl.eval_banks import (extract_all, generate_texts, limit_turns, rag_bank, run_manager,
                                 with_tokens)
from memr1.rl.eval_report import aggregate, format_table, oracle_scores, percentiles, summarize_oracle
from memr1.rl.judge import judge_answers
from memr1.rl.rewards import score_answer

BASELINES = ("memr1", "base", "rag", "full_context")
JUDGES = ("off", "local", "openai")

FULL_CONTEXT_SYSTEM = """You answer a question about a conversation between two people, shown in
full with the date of each session. Reply with one line, "Answer: <answer>", in at most 5 or 6
words. Turn relative dates into absolute dates using the session's date."""


class EvalConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    baseline: str = "memr1"            # memr1 | base | rag | full_context
    batch_size: int = 64               # prompts per generate call
    extract_max_new_tokens: int = 96
    manager_max_new_tokens: int = 256
    answer_max_new_tokens: int = 96
    manager_turns_per_call: int = 1    # >1: facts of that many consecutive turns of a speaker per call
    extract_context_turns: int = 2     # preceding turns shown to extraction for references
    max_turns: int = 0                 # per conversation, 0 = all (smoke runs)
    max_questions: int = 0             # per conversation, 0 = all (smoke runs)
    judge: str = "off"                 # off | local (the eval model) | openai (judge_url + judge_model)
    judge_url: str = ""
    judge_model: str = ""
    judge_api_key_env: str = "OPENAI_API_KEY"
    judge_retries: int = 2
    judge_max_new_tokens: int = 64
    fact_match_f1: float = 0.5         # oracle fact matching threshold (see eval_report)
    cache_dir: str = ""                # "" = $MEMR1_CACHE/eval, else <run_dir>/cache
    progress: bool = True

    def check(self) -> None:
        if self.baseline not in BASELINES:
            raise ValueError(f"eval.baseline must be one of {BASELINES}, got {self.baseline!r}")
        if self.judge not in JUDGES:
            raise ValueError(f"eval.judge must be one of {JUDGES}, got {self.judge!r}")
        if self.judge == "openai" and not (self.judge_url and self.judge_model):
            raise ValueError("eval.judge = 'openai' needs eval.judge_url and eval.judge_model")
        for name in ("batch_size", "extract_max_new_tokens", "manager_max_new_tokens", "answer_max_new_tokens",
                     "manager_turns_per_call", "judge_max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"eval.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("extract_context_turns", "max_turns", "max_questions", "judge_retries"):
            if getattr(self, name) < 0:
                raise ValueError(f"eval.{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 < self.fact_match_f1 <= 1.0:
            raise ValueError(f"eval.fact_match_f1 must be in (0, 1], got {self.fact_match_f1}")


ROLES = ("extract", "manager", "answer")


def evaluate(conversations: list, split: str, generator, embedder, cfg: EvalConfig, *, sampling=None,
             cache_dir: str | Path, facts_dir: str | Path | None = None, model_id: str = "",
             extract_cfg: ExtractConfig = ExtractConfig(),
             manager_cfg: ManagerConfig = ManagerConfig(), answer_cfg: AnswerConfig = AnswerConfig(),
             judge=None, count_tokens=None, context_limit: int | None = None,
             bank_overrides: dict | None = None) -> dict:
    """Run one split and return the report (a JSON-ready dict; `format_table(report["metrics"])`).

    `generator` is one Generator for every role, or a dict role -> Generator for ROLES (the trained
    manager and answer agent are different checkpoints); `sampling` is the generators' greedy
    sampling settings (its max_new_tokens is set per stage); `cache_dir` the folder for this (data,
    model, config)'s banks and `facts_dir` for its extractions (default: cache_dir); `judge` a generator for J or None
    (J is then null); `count_tokens(messages)` and `context_limit` gate full_context prompts."""
    builds: dict = {}   # filled by bank building; its banks are closed however the run ends
    try:
        gens = generator if isinstance(generator, dict) else dict.fromkeys(ROLES, generator)
        missing = [r for r in ROLES if r not in gens]
        if missing:
            raise ValueError(f"evaluate: no generator for role(s) {missing}")
        return _evaluate(conversations, split, gens, embedder, cfg, sampling, Path(cache_dir),
                         Path(facts_dir or cache_dir), model_id, extract_cfg, manager_cfg, answer_cfg, judge, count_tokens, context_limit,
                         bank_overrides or {}, builds)
    finally:
        for b in builds.values():
            b.bank.close()


def _evaluate(conversations, split, gens, embedder, cfg, sampling, cache_dir, facts_dir, model_id, extract_cfg,
              manager_cfg, answer_cfg, judge, count_tokens, context_limit, bank_overrides, builds) -> dict:
    cfg.check()
    if not conversations:
        raise ValueError(f"evaluate: no conversations in split {split!r}")
    if cfg.baseline == "full_context" and (count_tokens is None or not context_limit):
        raise ValueError("evaluate: baseline full_context needs count_tokens and context_limit")
    t_start = time.perf_counter()
    lat = {"manager": [], "search": [], "answer": []}
    dirs = {c.sample_id: cache_dir / c.sample_id for c in conversations}
    fact_dirs = {c.sample_id: facts_dir / c.sample_id for c in conversations}
    bar = lambda desc: tqdm(desc=desc, total=0, unit="prompt", disable=not cfg.progress, dynamic_ncols=True)

    banks, skipped, contexts = {}, [], {}
    if cfg.baseline in ("memr1", "base"):
        with bar("extract facts") as b:
            facts = extract_all(conversations, fact_dirs, gens["extract"], with_tokens(sampling, cfg.extract_max_new_tokens),
                                cfg, extract_cfg, b)
        with bar("manager steps") as b:
            builds.update(run_manager(conversations, dirs, facts, gens["manager"], embedder,
                                      with_tokens(sampling, cfg.manager_max_new_tokens), cfg, manager_cfg,
                                      bank_overrides, lat["manager"], b))
        banks = {sid: build.bank for sid, build in builds.items()}
    elif cfg.baseline == "rag":
        banks = {c.sample_id: rag_bank(c, embedder, cfg) for c in conversations}
    else:
        contexts, skipped = full_contexts(conversations, cfg, count_tokens, context_limit)

    # Every question of every conversation goes out in one batched pass.
    items, prompts = [], []
    for c in conversations:
        if cfg.baseline == "full_context":
            for q in questions_of(c, cfg) if c.sample_id in contexts else []:
                items.append((c, q, 0))
                prompts.append([{"role": "system", "content": FULL_CONTEXT_SYSTEM},
                                {"role": "user", "content": f"{contexts[c.sample_id]}\n\nQuestion: {q.question}"}])
        else:
            for q, memories in retrieve(c, banks[c.sample_id], embedder, answer_cfg, lat["search"], cfg):
                items.append((c, q, sum(len(m) for m in memories.values())))
                prompts.append(build_answer_messages(q.question, memories, answer_cfg))
    texts = []
    if prompts:
        with tqdm(desc="answer", total=len(prompts), unit="q", disable=not cfg.progress, dynamic_ncols=True) as b:
            texts = generate_texts(gens["answer"], prompts, with_tokens(sampling, cfg.answer_max_new_tokens),
                                   cfg.batch_size, lat["answer"], b)
    records = []
    for (c, q, n_mem), text in zip(items, texts):
        pred = parse_answer(text, answer_cfg).answer
        records.append({"sample_id": c.sample_id, "question": q.question, "gold": q.answer, "prediction": pred,
                        "category": q.category, **score_answer(pred, q.answer), "judge": None,
                        "memories_shown": n_mem})
    judge_info = run_judge(judge, records, sampling, cfg)

    oracle_parts = []
    for c in conversations:
        if c.oracle and c.sample_id in builds:
            b = builds[c.sample_id]
            limit = {t.dia_id for t in limit_turns(c, cfg)} if cfg.max_turns else None
            oracle_parts.append(oracle_scores(c, b.steps, [m.text for m in b.bank], cfg.fact_match_f1,
                                              limit))
    return {
        "split": split, "baseline": cfg.baseline, "model": model_id,
        "n_conversations": len(conversations), "n_questions": len(records),
        "n_skipped_questions": sum(s["questions"] for s in skipped),
        "category_mapping": {"name": "mem0", **{str(k): v for k, v in CATEGORY_NAMES.items()}},
        "metrics": aggregate(records, judged=judge is not None),
        "latency": {k: percentiles(v) for k, v in lat.items()},
        "latency_note": "batched: a prompt's latency is its generate call's wall time / prompts in the call; "
                        "search is per question (both speakers)",
        "judge": judge_info, "skipped": skipped, "manager": summarize_manager(builds, cfg),
        "oracle": summarize_oracle(oracle_parts),
        "config": msgspec.to_builtins(cfg), "wall_s": time.perf_counter() - t_start,
        "answers": records,
    }


def questions_of(conv, cfg: EvalConfig) -> list:
    return conv.qa[: cfg.max_questions] if cfg.max_questions else list(conv.qa)


def retrieve(conv, bank, embedder, answer_cfg: AnswerConfig, search_latencies: list, cfg: EvalConfig):
    """(question, {speaker: top-k memories}) for the conversation's questions; one embedder call."""
    qs = questions_of(conv, cfg)
    vectors = embedder.embed([q.question for q in qs]) if qs else []
    out = []
    for q, v in zip(qs, vectors):
        t0 = time.perf_counter()
        memories = {s: bank.items_for_prompt(vector=v, k=answer_cfg.top_k_per_speaker, speaker=s)
                    for s in (conv.speaker_a, conv.speaker_b)}
        search_latencies.append(time.perf_counter() - t0)
        out.append((q, memories))
    return out


def full_contexts(conversations, cfg: EvalConfig, count_tokens, context_limit: int):
    """sample_id -> the conversation as text, for those that fit; the others as skip records."""
    contexts, skipped = {}, []
    for c in conversations:
        text = conversation_text(c, cfg)
        probe = [{"role": "system", "content": FULL_CONTEXT_SYSTEM},
                 {"role": "user", "content": f"{text}\n\nQuestion: ?"}]
        need = count_tokens(probe) + 32 + cfg.answer_max_new_tokens   # 32: room for the question
        if need > context_limit:
            skipped.append({"sample_id": c.sample_id, "questions": len(questions_of(c, cfg)),
                            "reason": f"the conversation needs about {need} tokens with the question and "
                                      f"answer; the context holds {context_limit}"})
        else:
            contexts[c.sample_id] = text
    return contexts, skipped


def run_judge(judge, records: list[dict], sampling, cfg: EvalConfig) -> dict:
    """Labels each record's "judge" CORRECT / WRONG / FAILED (retried first); a no-op without a judge."""
    info = {"kind": cfg.judge if judge is not None else "off", "calls": 0, "n_failed": 0, "errors": []}
    if judge is None or not records:
        return info
    rep = judge_answers(judge, [(r["question"], r["gold"], r["prediction"]) for r in records],
                        with_tokens(sampling, cfg.judge_max_new_tokens), cfg.judge_retries)
    for r, label in zip(records, rep.labels):
        r["judge"] = label
    info.update(calls=rep.calls, n_failed=rep.n_failed, errors=rep.errors[:20])
    return info


def conversation_text(conv, cfg: EvalConfig) -> str:
    keep = {t.dia_id for t in limit_turns(conv, cfg)}
    parts = []
    for s in conv.sessions:
        lines = [f"{t.speaker}: {t.text}" for t in s.turns if t.dia_id in keep]
        if lines:
            parts.append(f"Session {s.index} ({s.date_time}):\n" + "\n".join(lines))
    return "\n\n".join(parts)


def summarize_manager(builds: dict, cfg: EvalConfig) -> dict | None:
    if not builds:
        return None
    groups = [g for b in builds.values() for s in b.steps for g in s.get("groups", [])]
    events = {e: sum(g["events"].count(e) for g in groups) for e in ("ADD", "UPDATE", "DELETE", "NONE")}
    status = {}
    for g in groups:
        status[g["status"]] = status.get(g["status"], 0) + 1
    return {"turns_per_call": cfg.manager_turns_per_call, "calls": len(groups), "events": events,
            "status": status, "recovered_steps": sum(bool(s.get("recovered")) for b in builds.values() for s in b.steps),
            "final_memories": {sid: len(b.bank) for sid, b in builds.items()}}


def write_report(report: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(path)
    return path


def table(report: dict) -> str:
    title = (f"{report['baseline']} on {report['split']} ({report['n_conversations']} conversations, "
             f"{report['n_questions']} questions; F1 / BLEU-1 / J in %, Mem0 categories)")
    return format_table(report["metrics"], title)
