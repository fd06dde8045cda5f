"""Answer metrics as the Mem0 evaluation (which Memory-R1 follows) computes them: EM, F1, BLEU-1.

- F1 works on token *sets*: lower-case, replace `. , ! ?` with spaces, split on whitespace. No stemming,
  no article removal. An empty prediction or reference scores 0.
- EM (the training reward) compares the same normalized token sequences, so "Paris." == "paris".
- BLEU-1 reproduces NLTK's `sentence_bleu(weights=(1, 0, 0, 0), smoothing=method1)` on word tokens of
  the lower-cased strings. It is written out here so the trainer never imports nltk at runtime; a test
  compares it with NLTK on a fuzz set.
"""
import math
import re
from collections import Counter
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

_PUNCT = str.maketrans({".": " ", ",": " ", "!": " ", "?": " "})


def simple_tokens(text: str) -> list[str]:
    """Mem0's F1 tokenization: lower-case, `. , ! ?` become spaces, split on whitespace."""
    return str(text).lower().translate(_PUNCT).split()


def normalize(text: str) -> str:
    return " ".join(simple_tokens(text))


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalized strings are equal and non-empty, else 0.0."""
    p, g = normalize(prediction), normalize(gold)
    return float(bool(g) and p == g)


def f1(prediction: str, gold: str) -> float:
    p, g = set(simple_tokens(prediction)), set(simple_tokens(gold))
    common = len(p & g)
    if not p or not g or common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


# A small word tokenizer that behaves like NLTK's Treebank-style `word_tokenize` on answers: quotes
# become `` and '', curly quotes stand alone, ':' and ',' split unless a digit follows ("1:56" stays
# whole), runs of dots, brackets, "--" and ;@#$%&?!* stand alone, a final period splits off, then
# clitics split ("don't" -> "do n't") and so do "gonna"-style words. It does no sentence splitting, so
# a period ending an inner sentence stays attached, as NLTK's tokenizer alone does (word_tokenize would
# first split sentences with punkt, whose data is not installed here; answers are a few words).
_TOKEN_RULES = [
    (re.compile("[\u00ab\u201c\u2018\u201e\u00bb\u201d\u2019]"), r" \g<0> "),
    (re.compile(r'(^|[\s(\[{<])"'), r"\1 `` "),
    (re.compile(r'"'), " '' "),
    (re.compile(r"(?<!\w)'(?!(?:re|ve|ll|m|t|s|d|n)\b)(?=\w)"), "' "),
    (re.compile(r"([:,])(?=\D|$)"), r" \1 "),
    (re.compile(r"\.{2,}"), r" \g<0> "),
    (re.compile(r"--|[;@#$%&?!*\[\](){}<>\u2012-\u2015]"), r" \g<0> "),
    (re.compile(r"([^.])\.([\])}>'\s]*)$"), r"\1 . \2"),
    (re.compile(r"([^\s'])'(?=\s|$)"), r"\1 '"),
    (re.compile(r"(?i)([^\s'])(n't|'s|'re|'ve|'ll|'d|'m)(?=\s|$)"), r"\1 \2"),
    (re.compile(r"\b(can)(not)\b|\b(gon|wan)(na)\b|\b(got)(ta)\b|\b(lem|gim)(me)\b"),
     lambda m: " ".join(g for g in m.groups() if g)),
]


def word_tokens(text: str) -> list[str]:
    """Lower-cased word tokens for BLEU-1 (see the rules above)."""
    s = str(text).lower().strip()
    for pattern, repl in _TOKEN_RULES:
        s = pattern.sub(repl, s)
    return s.split()


def bleu1_tokens(hypothesis: list[str], reference: list[str]) -> float:
    """NLTK sentence_bleu([reference], hypothesis, weights=(1,0,0,0), smoothing method1).

    With only the unigram weight non-zero, the score is the brevity penalty times the clipped unigram
    precision; NLTK returns 0 outright when no unigram matches (so method1's epsilon never shows)."""
    if not hypothesis:
        return 0.0
    ref_counts = Counter(reference)
    matches = sum(min(c, ref_counts[w]) for w, c in Counter(hypothesis).items())
    if matches == 0:
        return 0.0
    c, r = len(hypothesis), len(reference)
    bp = 1.0 if c > r else math.exp(1 - r / c)
    # exp(log(.)) mirrors NLTK's arithmetic so results agree to the last bits.
    return bp * math.exp(math.fsum([math.log(matches / c)]))


def bleu1(prediction: str, gold: str) -> float:
    return bleu1_tokens(word_tokens(prediction), word_tokens(gold))


def score_answer(prediction: str, gold: str) -> dict[str, float]:
    """All three metrics for one answer; eval averages these per category."""
    return {"em": exact_match(prediction, gold), "f1": f1(prediction, gold),
            "bleu1": bleu1(prediction, gold)}


# ---- training rewards: small functions that return their breakdown (the parts sum to the reward) ----
class RewardConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    kind: Literal["em", "f1", "judge"] = "em"   # what scores an answer; the paper trains on EM
    # Penalties are subtracted, so a negative one would reward the failure.
    format_penalty: Annotated[float, Meta(ge=0, le=1000)] = 1.0       # manager: the completion is not the op JSON
    invalid_op_penalty: Annotated[float, Meta(ge=0, le=1000)] = 0.0   # manager: per op dropped (unknown id or
                                                             # event, duplicate) or rejected by the bank
    answer_format_penalty: Annotated[float, Meta(ge=0, le=1000)] = 0.0  # answer agent: no "Answer:" line
    # manager: per memory the call's applied ops add beyond one per fact it reads (ADDs minus DELETEs,
    # never below 0): a call-level form of Memory-R2's compression penalty with its free zone; not in
    # Memory-R1. The outcome alone pays a manager that writes each fact twice (two copies take two of
    # the answer agent's top-k slots from the stale memory beside them) and never UPDATEs; one memory
    # per fact stays free, so an ADD of a new fact costs nothing.
    memory_penalty: Annotated[float, Meta(ge=0, le=1000)] = 0.0
    # the free zone's size, in memories per fact read (rounded down): 1 is one memory per fact; below 1 a
    # manager must merge or update to stay free (configs/budget.toml sets what its oracle needs)
    memory_free_per_fact: Annotated[float, Meta(ge=0, le=1)] = 1.0


def answer_score(prediction: str, gold: str, kind: str, judge_label: str | None = None) -> float:
    """The outcome score of one answer: EM, token-set F1, or the judge's CORRECT (1) / other (0)."""
    if kind == "em":
        return exact_match(prediction, gold)
    if kind == "f1":
        return f1(prediction, gold)
    if kind == "judge":
        return float(judge_label == "CORRECT")
    raise ValueError(f"reward.kind must be em, f1 or judge, got {kind!r}")


def answer_reward(score: float, has_answer_tag: bool, cfg: RewardConfig) -> dict[str, float]:
    """The answer agent's reward parts: the outcome score, minus a penalty without an `Answer:` line."""
    return {cfg.kind: score, "format": 0.0 if has_answer_tag else -cfg.answer_format_penalty}


def manager_reward(answer_scores: list[float], parsed: bool, invalid_ops: int, cfg: RewardConfig,
                   growth: int = 0, facts: int = 0) -> dict[str, float]:
    """The manager's reward parts: the frozen answer agent's mean score on the edited bank (the
    paper's outcome reward), minus the format, invalid-op and memory-growth penalties (`growth`: the
    memories the applied ops added, net of deletions; `facts`: the facts the call read, which size its
    free zone)."""
    outcome = sum(answer_scores) / len(answer_scores) if answer_scores else 0.0
    return {cfg.kind: outcome, "format": 0.0 if parsed else -cfg.format_penalty,
            "invalid_op": -cfg.invalid_op_penalty * invalid_ops,
            "memory": -cfg.memory_penalty * max(0, growth - math.floor(cfg.memory_free_per_fact * facts))}
