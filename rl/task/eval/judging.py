"""LLM-as-a-Judge (the J metric): a generous CORRECT/WRONG label per answer.

The judge is any `Generator` (see memr1.rl.generation): the base model, or an OpenAI-compatible chat
endpoint (engine/generation/openai_chat.py). Unparseable verdicts are retried; items that still fail
are counted as FAILED and reported, never silently scored as right or wrong.
"""
import re
from typing import Annotated

import msgspec
from msgspec import Meta

from memr1.rl.task.agents.jsonish import MAX_CHARS, extract_json
from memr1.rl.generation import SamplingConfig

LABELS = ("CORRECT", "WRONG")

JUDGE_SYSTEM = """You grade answers to questions about past conversations. You get the question, the
gold answer and a generated answer. Be generous:
- The generated answer is CORRECT if it refers to the same thing as the gold answer, even when it is
  longer, worded differently, or adds harmless detail.
- A date or time period is CORRECT if it means the same date or period in another format
  ("7 May 2023", "May 7th, 2023", "the day before 8 May 2023").
- Otherwise, including empty or unrelated answers, it is WRONG.

Reply with JSON only: {"reasoning": "<one sentence>", "label": "CORRECT"} or with "WRONG"."""


def build_judge_messages(question: str, gold: str, answer: str) -> list[dict]:
    for name, value in (("question", question), ("gold", gold), ("answer", answer)):
        if not isinstance(value, str):
            raise TypeError(f"build_judge_messages: {name} must be str, got {type(value).__name__}")
    user = f"Question: {question}\nGold answer: {gold}\nGenerated answer: {answer}"
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


def parse_judge(output) -> str | None:
    """CORRECT, WRONG, or None when the verdict cannot be read. Never raises."""
    value, _ = extract_json(output, dict)
    if isinstance(value, dict):
        label = next((v for k, v in value.items() if str(k).lower() == "label"), None)
        if isinstance(label, str) and label.strip().upper() in LABELS:
            return label.strip().upper()
    if isinstance(output, str):   # no usable JSON: accept a bare verdict only when it is unambiguous
        found = {w.upper() for w in re.findall(r"\b(correct|wrong)\b", output[:MAX_CHARS], re.I)}
        if len(found) == 1:
            return found.pop()
    return None


class JudgeReport(msgspec.Struct):
    labels: list[str]          # CORRECT / WRONG / FAILED, one per item
    n_correct: int
    n_wrong: int
    n_failed: int
    calls: int                 # generate() calls made, retries included
    errors: list[str]          # generator exceptions, for the log

    @property
    def score(self) -> float:
        """Percent CORRECT among the items that got a verdict (FAILED items reported separately)."""
        judged = self.n_correct + self.n_wrong
        return 100.0 * self.n_correct / judged if judged else 0.0


class JudgeConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Who grades answers, for the J metric and for `reward.kind = "judge"`."""
    kind: str = "off"                 # off | local (the base model) | openai (url + model)
    url: str = ""                     # an OpenAI-compatible API base, e.g. http://localhost:8000/v1
    model: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    retries: Annotated[int, Meta(ge=0, le=100)] = 2
    max_new_tokens: Annotated[int, Meta(ge=1, le=65_536)] = 64

    def __post_init__(self):
        if self.kind not in ("off", "local", "openai"):
            raise ValueError(f"judge.kind must be off, local or openai, got {self.kind!r}")
        if self.kind == "openai" and not (self.url and self.model):
            raise ValueError("judge.kind = 'openai' needs judge.url and judge.model")
        if self.retries < 0 or self.max_new_tokens < 1:
            raise ValueError("judge.retries must be >= 0 and judge.max_new_tokens >= 1")


class Judge:
    """A judge generator with its settings: `label(items)` grades (question, gold, answer) triples."""

    def __init__(self, generator, cfg: JudgeConfig):
        self.generator, self.cfg = generator, cfg

    def label(self, items: list[tuple[str, str, str]]) -> JudgeReport:
        sampling = SamplingConfig(temperature=0.0, max_new_tokens=self.cfg.max_new_tokens)
        return judge_answers(self.generator, items, sampling, self.cfg.retries)


def judge_answers(generator, items: list[tuple[str, str, str]], sampling: SamplingConfig,
                  retries: int = 2) -> JudgeReport:
    """Label (question, gold, answer) items with one batched call, then retry the unreadable ones."""
    labels: list[str | None] = [None] * len(items)
    prompts = [build_judge_messages(q, g, a) for q, g, a in items]
    pending, calls, errors = list(range(len(items))), 0, []
    for _ in range(1 + max(0, retries)):
        if not pending:
            break
        calls += 1
        try:
            outs = generator.generate([prompts[i] for i in pending], 1, sampling)
        except Exception as e:   # a flaky endpoint costs a retry, not the whole evaluation
            errors.append(f"{type(e).__name__}: {e}"[:300])
            continue
        for i, completions in zip(pending, outs):
            text = getattr(completions[0], "text", "") if completions else ""
            labels[i] = parse_judge(text)
        pending = [i for i in pending if labels[i] is None]
    final = [lab or "FAILED" for lab in labels]
    return JudgeReport(labels=final, n_correct=final.count("CORRECT"), n_wrong=final.count("WRONG"),
                       n_failed=final.count("FAILED"), calls=calls, errors=errors)
