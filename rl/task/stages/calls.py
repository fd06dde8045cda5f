"""The two Memory-R1 RL stages as the loop sees them: a step number in, a scored Rollout of groups out.

ManagerStage: each item's manager turn gets G completions; each completion's ops go to its own O(1)
fork of the item's bank; the frozen Answer Agent answers the item's questions from every fork; the
reward is `rewards.manager_reward` (the answers' mean EM/F1/judge score minus penalties).
AnswerStage: the answer turn gets G completions; the reward is `rewards.answer_reward`.
Both build prompts and apply ops through rl/task/turns.py, exactly as evaluation does. Under data
parallelism a stage rolls out only its rank's share of each step's items (`items.step_items`).

Dynamic sampling (`refill`, DAPO's): a group whose completions all scored the same carries no GRPO
signal. With refill on, such groups are dropped and more items are rolled out, a round at a time, until
the step holds its configured number of informative groups or `refill` extra prompts were drawn.
"""
import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Annotated

import msgspec
from msgspec import Meta

from memr1.memory_store import Add, Delete
from memr1.rl.task.agents.answer import AnswerConfig, parse_answer
from memr1.rl.task.agents.manager import EVENTS
from memr1.rl.generation import GREEDY, hit_cap
from memr1.rl.task.train_items import step_items
from memr1.rl.records import Group, Rollout, TrainBatch
from memr1.rl.task.rewards import RewardConfig, answer_reward, answer_score, exact_match, f1, manager_reward
from memr1.rl.task.stages.context import StageContext
from memr1.rl.task.stages.samples import answer_samples, manager_samples
from memr1.rl.spans import span
from memr1.rl.task.turns import AnswerRequest, answer_prompts, apply_outcomes, decide, manager_turns


class StageConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    # Ranges (Meta) are checked when a config is read, so a bad value fails before any engine starts.
    steps: Annotated[int, Meta(ge=1, le=1_000_000)] = 4
    prompts_per_step: Annotated[int, Meta(ge=1, le=1_000_000)] = 128   # prompts per step, as verl's train_batch_size counts them
    group_size: Annotated[int, Meta(ge=1, le=1024)] = 8           # completions per prompt (GRPO's n; PPO samples 1); warm stages: 1
    lr: Annotated[float, Meta(gt=0, le=1)] = 1e-6

    def __post_init__(self):
        for name in ("steps", "prompts_per_step", "group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class ManagerRLConfig(StageConfig, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """The call-level manager stage's settings: a stage's, plus hints (rl/task/hints.py)."""
    hints: Annotated[int, Meta(ge=0, le=1023)] = 0   # of each group on a call whose oracle reply UPDATEs or
                                                     # DELETEs, completions that start from that reply

    def __post_init__(self):
        super().__post_init__()
        if self.hints >= self.group_size:
            raise ValueError(f"hints must be below group_size ({self.group_size}), got {self.hints}: "
                             f"a group needs unhinted completions to compare the hinted ones with")


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def group_of(completions: list, rewards: list[dict], source: str) -> Group:
    """A Group from one prompt's completions and each one's reward parts."""
    parts = {k: [r[k] for r in rewards] for k in rewards[0]}
    return Group(prompt_ids=list(completions[0].prompt_token_ids), responses=[list(c.token_ids) for c in completions],
                 behav_logprobs=[list(c.logprobs) for c in completions],
                 rewards=[sum(r.values()) for r in rewards], breakdown=parts,
                 truncated=[hit_cap(c) for c in completions], source=source)


def reward_metrics(groups: list[Group]) -> dict:
    """reward_mean and the mean of each reward part (reward_<part>), over every completion."""
    out = {"reward_mean": mean(r for g in groups for r in g.rewards)}
    for part in groups[0].breakdown if groups else ():
        out[f"reward_{part}"] = mean(v for g in groups for v in g.breakdown[part])
    return out


# rollout metrics that add up when a step rolls out more than once (refill): counts and phase times
ADDED = ("response_tokens", "completions", "forks", "bank_ops", "frozen_answers", "frozen_prompts", "frozen_tokens",
         "gen_s", "prompt_s", "score_s", "fork_s", "frozen_s")


def informative(g: Group) -> bool:
    """Whether GRPO can learn from the group: its completions did not all score the same."""
    return len(set(g.rewards)) > 1


def refill_items(items: list, step: int, drawn: int, n: int, rank: int) -> list:
    """`n` more items for `step` (the refill's rounds so far drew `drawn`): a draw fixed by (step, drawn,
    rank), so a resumed run refills as the first run did."""
    rng = random.Random(f"refill {step} {drawn} {rank}")
    return [items[i] for i in rng.sample(range(len(items)), min(n, len(items)))]


def with_refill(stage, step: int, generator, first: Rollout) -> Rollout:
    """`first` (the step's rollout) with its equal-reward groups replaced by informative groups of extra
    items, rolled out in rounds of as many items as groups are missing, until the step holds as many
    groups as it drew or `stage.refill` extra items were drawn. The metrics stay those of the step's own
    items, with the extra work added to the counters and `refill_*` saying what was drawn and dropped."""
    want = len(first.batch.groups)
    keep = [g for g in first.batch.groups if informative(g)]
    samples, metrics, drawn = list(first.samples), dict(first.metrics), 0
    while len(keep) < want and drawn < stage.refill:
        n = min(want - len(keep), stage.refill - drawn)
        extra = stage.rollout_items(refill_items(stage.items, step, drawn, n, stage.ctx.rank), generator)
        drawn += n
        keep += [g for g in extra.batch.groups if informative(g)]
        samples += extra.samples
        for k in ADDED:
            if k in extra.metrics:
                metrics[k] = metrics.get(k, 0) + extra.metrics[k]
    groups = keep[:want] or first.batch.groups   # none informative: the step as drawn (it trains nothing)
    metrics.update(refill_drawn=drawn, refill_dropped=want + drawn - len(keep))
    return Rollout(TrainBatch(groups, first.batch.weight_version), metrics, samples)


def score_answers(texts: list[str], golds: list[str], questions: list[str], cfg: AnswerConfig,
                  reward: RewardConfig, judge) -> tuple[list, list[float]]:
    """Each answer parsed and scored with the reward's kind (the judge labels them all in one pass)."""
    with span("parse"):
        parsed = [parse_answer(t, cfg) for t in texts]
    labels = [None] * len(texts)
    if reward.kind == "judge":
        if judge is None:
            raise ValueError("reward.kind = 'judge' needs a judge: set judge.kind = local or openai")
        labels = judge.label(list(zip(questions, golds, [p.answer for p in parsed]))).labels
    return parsed, [answer_score(p.answer, g, reward.kind, lab) for p, g, lab in zip(parsed, golds, labels)]


def bank_growth(outcome) -> int:
    """Memories an outcome's applied ops add to the bank, net of the ones they delete."""
    if not outcome.applied:
        return 0
    return sum(isinstance(op, Add) for op in outcome.store_ops) - sum(isinstance(op, Delete) for op in outcome.store_ops)


def greedy_once(generator, prompts: list, max_new_tokens: int) -> tuple[list, int]:
    """(one greedy completion per prompt, the number of distinct prompts), each distinct prompt
    generated once: a group's forks often hold the same bank, so their answer prompts repeat, and
    greedy decoding gives each copy the same answer."""
    keys = [json.dumps(p, sort_keys=True) for p in prompts]
    first: dict[str, list] = {}
    for k, p in zip(keys, prompts):
        first.setdefault(k, p)
    got = generator.generate(list(first.values()), 1, GREEDY.with_tokens(max_new_tokens)) if first else []
    by_key = dict(zip(first, got))
    return [by_key[k] for k in keys], len(first)


class CallStage:
    """What the two call-level stages share: a step's items (this rank's share), rolled out by the
    stage's `rollout_items`, refilled when `refill` is on, and the step's informative groups counted."""

    def rollout(self, step: int, generator) -> Rollout:
        first = self.rollout_items(step_items(self.items, step, self.cfg.prompts_per_step, self.ctx.rank, self.ctx.world),
                                   generator)
        out = with_refill(self, step, generator, first) if self.refill else first
        out.metrics["informative_groups"] = sum(informative(g) for g in out.batch.groups)
        return out


@dataclass
class ManagerScores:
    """What `ManagerStage.score` found, per completion (outcomes, parts, scores) and per answer."""
    outcomes: list            # ManagerOutcome per completion
    parts: list[dict]         # reward parts per completion
    scores: list[list[float]]  # the answer scores behind each completion's outcome reward
    answers: list             # the frozen answerer's completions, flat over (completion, question)
    parsed: list              # those answers parsed
    golds: list[str]
    fork_s: float
    frozen_s: float
    frozen_prompts: int       # distinct answer prompts generated (the rest repeat one of them)
    bank_after: list[int]     # memories in each completion's fork after its ops


class ManagerStage(CallStage):
    name = "manager"

    def __init__(self, items, frozen_answer, ctx: StageContext, cfg: StageConfig, hints=None, refill: int = 0):
        self.items, self.frozen, self.ctx, self.cfg = items, frozen_answer, ctx, cfg
        self.refill = refill         # extra items a step may draw to replace equal-reward groups (0: off)
        self.hints = hints           # rl.task.hints.Hints: some completions start from the oracle's reply
        self.item_stats: dict = {}   # the items' counts (engine/items.py), logged with every step

    def score(self, items, turns, owners: list[int], completions: list) -> "ManagerScores":
        """Score manager completions (`owners[j]`: the index in `items`/`turns` that completion j
        answers): each edits its own fork of its item's bank (a refused or unparsed one leaves it as
        it was), the frozen Answer Agent answers the item's questions from every fork in one generate
        call, and each completion gets `rewards.manager_reward`. Rollouts and rl/task/eval/op_probe.py call this."""
        with span("parse"):
            outcomes = decide([(turns[i], c) for i, c in zip(owners, completions)], self.ctx.embedder, self.ctx.task.manager)
        forks = []
        t1 = time.perf_counter()
        with span("fork_apply"):
            for i, outcome in zip(owners, outcomes):
                forks.append(items[i].bank.fork())
                apply_outcomes(forks[-1], [outcome])
        t2 = time.perf_counter()
        with span("frozen_answers"):
            requests, who = [], []
            for j, (i, fork) in enumerate(zip(owners, forks)):
                requests += [AnswerRequest(fork, qa.question, items[i].speakers) for qa in items[i].questions]
                who += [(j, qa.answer) for qa in items[i].questions]
            answers, distinct = greedy_once(self.frozen, answer_prompts(requests, self.ctx.embedder, self.ctx.task.answer),
                                            self.ctx.task.answer.max_new_tokens)
        t3 = time.perf_counter()
        golds = [g for _, g in who]
        with span("reward"):
            parsed, scores = score_answers([a[0].text for a in answers], golds, [r.question for r in requests],
                                           self.ctx.task.answer, self.ctx.reward, self.ctx.judge)
            per_fork = [[] for _ in forks]
            for (j, _), s in zip(who, scores):
                per_fork[j].append(s)
            parts = [manager_reward(per_fork[j], o.parsed, o.invalid_ops, self.ctx.reward, bank_growth(o),
                                    len(items[owners[j]].call["facts"]))
                     for j, o in enumerate(outcomes)]
        return ManagerScores(outcomes, parts, per_fork, answers, parsed, golds, t2 - t1, t3 - t2, distinct,
                             [len(f) for f in forks])

    def rollout_items(self, items: list, generator) -> Rollout:
        t0 = time.perf_counter()
        turns = manager_turns([(it.bank, it.call) for it in items],
                              self.ctx.embedder, self.ctx.task.manager)
        prompt_s = time.perf_counter() - t0
        sampling = self.ctx.sampling.with_tokens(self.ctx.task.manager.max_new_tokens)
        G = self.cfg.group_size
        with span("generate"):
            if self.hints is not None:
                completions, hinted = self.hints.generate(generator, items, turns, G, sampling)
            else:
                completions, hinted = generator.generate([t.prompt.messages for t in turns], G, sampling), []
        gen_s = time.perf_counter() - t0

        flat = [c for group in completions for c in group]
        owners = [j // G for j in range(len(flat))]
        sc = self.score(items, turns, owners, flat)
        outcomes, answers, parsed, golds = sc.outcomes, sc.answers, sc.parsed, sc.golds
        groups = [group_of(completions[i], sc.parts[i * G:(i + 1) * G], items[i].source) for i in range(len(items))]

        n = len(outcomes)
        status = Counter(o.status for o in outcomes)
        events = Counter(e for o in outcomes for e in o.events)
        metrics = {**reward_metrics(groups),
                   "em_mean": mean(exact_match(p.answer, g) for p, g in zip(parsed, golds)),
                   "f1_mean": mean(f1(p.answer, g) for p, g in zip(parsed, golds)),
                   "parse_failure_rate": status["parse_error"] / n,
                   "invalid_rate": (n - status["ok"] - status["parse_error"]) / n,
                   **{f"ops_{e.lower()}": events[e] / n for e in EVENTS},
                   "capped_rate": mean(o.truncated for o in outcomes),
                   "frozen_capped_rate": mean(hit_cap(a[0]) for a in answers),
                   **(self.hints.metrics(groups, hinted) if self.hints is not None else {}),
                   "frozen_answers": len(answers), "frozen_prompts": sc.frozen_prompts, "gen_s": gen_s,
                   "prompt_s": prompt_s, "score_s": time.perf_counter() - t0 - gen_s,
                   "response_tokens": sum(g.response_tokens for g in groups),
                   # counters for the throughput summary (engine/observe/throughput.py)
                   "completions": n, "forks": n, "fork_s": sc.fork_s, "frozen_s": sc.frozen_s,
                   "bank_ops": sum(len(o.store_ops) for o in outcomes if o.applied),
                   "frozen_tokens": sum(len(a[0].token_ids) for a in answers),
                   **{k: self.item_stats[k] for k in ("dead_items", "unreachable_questions") if k in self.item_stats}}
        return Rollout(TrainBatch(groups, generator.weight_version), metrics,
                       manager_samples(items, turns, owners, flat, sc, G))


class AnswerStage(CallStage):
    name = "answer"

    def __init__(self, items, ctx: StageContext, cfg: StageConfig, refill: int = 0):
        self.items, self.ctx, self.cfg = items, ctx, cfg
        self.refill = refill         # extra items a step may draw to replace equal-reward groups (0: off)

    def rollout_items(self, items: list, generator) -> Rollout:
        t0 = time.perf_counter()
        requests = [AnswerRequest(it.bank, it.question.question, it.speakers) for it in items]
        prompts = answer_prompts(requests, self.ctx.embedder, self.ctx.task.answer)
        prompt_s = time.perf_counter() - t0
        sampling = self.ctx.sampling.with_tokens(self.ctx.task.answer.max_new_tokens)
        with span("generate"):
            completions = generator.generate(prompts, self.cfg.group_size, sampling)
        gen_s = time.perf_counter() - t0
        flat = [(it, c) for it, group in zip(items, completions) for c in group]
        golds = [it.question.answer for it, _ in flat]
        with span("reward"):
            parsed, scores = score_answers([c.text for _, c in flat], golds, [it.question.question for it, _ in flat],
                                           self.ctx.task.answer, self.ctx.reward, self.ctx.judge)
            parts = [answer_reward(s, p.has_answer_tag, self.ctx.reward) for p, s in zip(parsed, scores)]
            G = self.cfg.group_size
            groups = [group_of(completions[i], parts[i * G:(i + 1) * G], items[i].source) for i in range(len(items))]
        metrics = {**reward_metrics(groups),
                   "em_mean": mean(exact_match(p.answer, g) for p, g in zip(parsed, golds)),
                   "f1_mean": mean(f1(p.answer, g) for p, g in zip(parsed, golds)),
                   "parse_failure_rate": mean(not p.has_answer_tag for p in parsed),
                   "capped_rate": mean(hit_cap(c) for _, c in flat),
                   "gen_s": gen_s, "prompt_s": prompt_s, "score_s": time.perf_counter() - t0 - gen_s,
                   "response_tokens": sum(g.response_tokens for g in groups), "completions": len(flat)}
        return Rollout(TrainBatch(groups, generator.weight_version), metrics,
                       answer_samples(items, completions, parsed, scores))
