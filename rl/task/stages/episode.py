"""The episode stage (rl/task/episodes.py) as the loop sees it: a step number in, a scored Rollout out.

A step's episodes advance together, session by session and call by call: the r-th call of session k of
every live lane (the G episodes of each item, plus the re-rolls of session k) goes into one generate
call, one completion per lane, each applied to its lane's own bank through rl/task/turns.py, exactly as
bank building applies them. A re-roll group forks the chosen episode's bank just before session k
(the snapshot at k - 1) and is scored and dropped as soon as session k ends; the episodes are scored on
their final banks. Every call's response carries its unit's reward and Credit (its level, comparison
group and level weight); rl/algos/advantages.py turns them into advantages, so the learner trains all
levels in one batch.
"""
from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field

from memr1.memory_store import MemoryBank
from memr1.rl.task.agents.manager import EVENTS
from memr1.rl.task.episodes import EpisodeConfig, EpisodeItem, bank_words, global_sample, local_sample, session_reward
from memr1.rl.task.evidence import evidence_misses, miss_rate, stored_turns
from memr1.rl.generation import hit_cap
from memr1.rl.task.train_items import step_items
from memr1.rl.records import Credit, Group, Rollout, TrainBatch
from memr1.rl.task.stages.context import StageContext
from memr1.rl.task.stages.samples import episode_sample
from memr1.rl.spans import span
from memr1.rl.task.stages.calls import StageConfig, greedy_once, mean, score_answers
from memr1.rl.task.turns import AnswerRequest, answer_prompts, apply_outcomes, decide, manager_turns


@dataclass
class Lane:
    """One bank moving through the window: an episode (level "global") or a re-roll ("local")."""
    item: int                  # index into the step's items
    level: str                 # "global" | "local"
    bank: MemoryBank
    session: int = 0           # a re-roll's session; an episode's current one
    finished: bool = True      # no call hit its token budget without a parsable reply
    words: list[int] = field(default_factory=list)    # bank words after each session (episodes)
    calls: list = field(default_factory=list)         # (session, call, completion, outcome, bank size
                                                      # before, after) of each call


class EpisodeStage:
    name = "manager_episode"

    def __init__(self, items_for, frozen_answer, ctx: StageContext, cfg: StageConfig, episode: EpisodeConfig,
                 validation: bool = False):
        """`items_for(sessions)`: the episode items of a window of that many sessions (built once each).
        `validation`: every step scores all of the rank's items (step only picks the curriculum phase)."""
        self.items_for, self.frozen, self.ctx, self.cfg, self.episode = items_for, frozen_answer, ctx, cfg, episode
        self.phases, self.validation = episode.phases(cfg.steps), validation

    def phase(self, step: int):
        """The curriculum phase that step `step` (0-based) belongs to."""
        ends = [end for _, end in self.episode.bounds(self.cfg.steps)]
        return self.phases[next((i for i, end in enumerate(ends) if step < end), len(ends) - 1)]

    # -- one step -------------------------------------------------------------------------------
    def rollout(self, step: int, generator) -> Rollout:
        t0 = time.perf_counter()
        phase, ep, G = self.phase(step), self.episode, self.cfg.group_size
        pool = self.items_for(phase.sessions)
        items = pool[self.ctx.rank::self.ctx.world] if self.validation else \
            step_items(pool, step, self.cfg.prompts_per_step, self.ctx.rank, self.ctx.world)
        # an item's draws depend on the step and the item alone: the same on a resume and at any world size;
        # validation draws the same questions at every step, so its scores compare
        rngs = [random.Random(f"{self.ctx.seed}:{'val' if self.validation else step}:{it.source}") for it in items]
        episodes = [[Lane(i, "global", MemoryBank.create(None, dim=self.ctx.embedder.dim)) for _ in range(G)]
                    for i in range(len(items))]
        samples = [global_sample(it, ep.global_questions, rng) for it, rng in zip(items, rngs)]
        rerolls, gen_s, forks = [], 0.0, 0
        for k in range(max(len(it.calls) for it in items)):
            lanes = [lane for i, it in enumerate(items) if k < len(it.calls) for lane in episodes[i]]
            for lane in lanes:
                lane.session = k
            local = []
            for i, (it, rng) in enumerate(zip(items, rngs)):
                if k < len(it.calls) and it.calls[k] and rng.random() < ep.reroll_prob:
                    snapshot = episodes[i][rng.randrange(G)].bank.fork()   # the episode's bank at k - 1
                    group = [Lane(i, "local", snapshot.fork(), k) for _ in range(ep.inner_n)]
                    local.append((i, k, group, local_sample(it, k, ep.local_questions, rng)))
                    forks += 1 + ep.inner_n
            gen_s += self.run_session(items, k, lanes + [lane for _, _, g, _ in local for lane in g], generator)
            for lane in lanes:
                lane.words.append(bank_words(lane.bank))
            rerolls += [(i, k, g, self.score_local(items[i], k, g, qs, phase)) for i, k, g, qs in local]
        with span("frozen_answers"):
            answered = self.answer_final(items, episodes, samples)
        rollout = self.assemble(items, episodes, samples, answered, rerolls, phase, gen_s, forks, t0)
        rollout.batch.weight_version = generator.weight_version
        return rollout

    def run_session(self, items: list[EpisodeItem], k: int, lanes: list[Lane], generator) -> float:
        """Session k's calls on every lane, one generate call per call position; returns its seconds."""
        gen_s = 0.0
        for r in range(max((len(items[lane.item].calls[k]) for lane in lanes), default=0)):
            live = [lane for lane in lanes if r < len(items[lane.item].calls[k])]
            calls = [items[lane.item].calls[k][r] for lane in live]
            turns = manager_turns([(lane.bank, c) for lane, c in zip(live, calls)],
                                  self.ctx.embedder, self.ctx.task.manager)
            t = time.perf_counter()
            with span("generate"):
                got = generator.generate([t.prompt.messages for t in turns], 1,
                                         self.ctx.sampling.with_tokens(self.ctx.task.manager.max_new_tokens))
            gen_s += time.perf_counter() - t
            with span("parse"):
                outcomes = decide([(turn, g[0]) for turn, g in zip(turns, got)], self.ctx.embedder, self.ctx.task.manager)
            with span("fork_apply"):
                for lane, call, g, outcome in zip(live, calls, got, outcomes):
                    before = len(lane.bank)
                    apply_outcomes(lane.bank, [outcome])
                    lane.calls.append((k, call, g[0], outcome, before, len(lane.bank)))
                    if outcome.truncated and not outcome.parsed:
                        lane.finished = False
        return gen_s

    def answers(self, requests: list[AnswerRequest], golds: list[str]) -> list[float]:
        prompts = answer_prompts(requests, self.ctx.embedder, self.ctx.task.answer)
        got, _ = greedy_once(self.frozen, prompts, self.ctx.task.answer.max_new_tokens)
        _, scores = score_answers([g[0].text for g in got], golds, [r.question for r in requests], self.ctx.task.answer,
                                  self.ctx.reward, self.ctx.judge)
        return scores

    def score_local(self, item: EpisodeItem, k: int, group: list[Lane], questions, phase) -> list[dict]:
        """Each re-roll's reward right after session k, on the group's shared question sample."""
        with span("frozen_answers"):
            scores = self.answers([AnswerRequest(lane.bank, qa.question, item.speakers) for lane in group
                                   for qa in questions], [qa.answer for _ in group for qa in questions])
        n = len(questions)
        out = [session_reward(scores[j * n:(j + 1) * n], bank_words(lane.bank), item.session_words[k],
                              self.ctx.reward.kind, phase.compression, self.episode.free_ratio, lane.finished)
               for j, lane in enumerate(group)]
        for lane in group:
            lane.bank = None   # the re-roll's bank is done with; its calls stay for training
        return out

    def answer_final(self, items, episodes, samples) -> list[list[list[float]]]:
        """Per item, per episode: the score of each sampled question on the episode's final bank."""
        requests, golds = [], []
        for i, it in enumerate(items):
            for lane in episodes[i]:
                requests += [AnswerRequest(lane.bank, qa.question, it.speakers) for _, qa in samples[i]]
                golds += [qa.answer for _, qa in samples[i]]
        scores, out, pos = self.answers(requests, golds) if requests else [], [], 0
        for i in range(len(items)):
            n = len(samples[i])
            out.append([scores[pos + e * n: pos + (e + 1) * n] for e in range(len(episodes[i]))])
            pos += n * len(episodes[i])
        return out

    # -- rewards, credit, the batch ---------------------------------------------------------------
    def assemble(self, items, episodes, samples, answered, rerolls, phase, gen_s, forks, t0) -> Rollout:
        ep, kind = self.episode, self.ctx.reward.kind
        units = []   # (lane, session, reward parts, group key, level weight)
        for i, it in enumerate(items):
            for e, lane in enumerate(episodes[i]):
                for k in range(len(it.calls)):
                    mine = [s for (sk, _), s in zip(samples[i], answered[i][e]) if sk == k]
                    parts = session_reward(mine, lane.words[k], it.session_words[k], kind, phase.compression,
                                           ep.free_ratio, lane.finished)
                    units.append((lane, k, parts, ("global", i, k), ep.global_weight))
        for i, k, group, rewards in rerolls:
            units += [(lane, k, parts, ("local", i, k), ep.local_weight) for lane, parts in zip(group, rewards)]
        keys = {key: n for n, key in enumerate(dict.fromkeys(u[3] for u in units))}
        totals = [sum(u[2].values()) for u in units]
        # Each unit's calls share its reward; it is compared within its (level, item, session) group.
        credit = [Credit(u[0].level, keys[u[3]], n, u[4]) for n, u in enumerate(units)]
        # Calls with the same prompt (the G episodes' first call, a re-roll group's first call, and any
        # call where lanes' banks agree) become one group of responses, each with its own credit, so
        # the learner computes that prompt once.
        by_prompt: dict[tuple, dict] = {}
        number: dict[tuple, int] = {}   # prompt -> its group's index in the batch
        outcomes, samples = [], []
        for (lane, k, parts, key, _), total, c in zip(units, totals, credit):
            for sk, call, completion, outcome, before, after in lane.calls:
                if sk != k:
                    continue
                outcomes.append(outcome)
                prompt = tuple(completion.prompt_token_ids)
                g = by_prompt.setdefault(prompt, {
                    "responses": [], "behav_logprobs": [], "rewards": [], "truncated": [], "credit": [],
                    "breakdown": {p: [] for p in parts}, "source": f"{items[lane.item].conv.sample_id} s{k + 1}"})
                index = number.setdefault(prompt, len(number))
                samples.append(episode_sample(index, len(g["responses"]), items[lane.item], lane.level, call,
                                              completion, outcome, before, after))
                g["responses"].append(list(completion.token_ids))
                g["behav_logprobs"].append(list(completion.logprobs))
                g["rewards"].append(total)
                g["truncated"].append(hit_cap(completion))
                g["credit"].append(c)
                for p, v in parts.items():
                    g["breakdown"][p].append(v)
        groups = [Group(prompt_ids=list(ids), **g) for ids, g in by_prompt.items()]
        return Rollout(TrainBatch(groups), self.metrics(items, episodes, answered, units, totals, outcomes, groups,
                                                        phase, gen_s, forks, t0), samples)

    def metrics(self, items, episodes, answered, units, totals, outcomes, groups, phase, gen_s, forks, t0) -> dict:
        """The step's log line: rewards and their parts per level, answers on the final banks, evidence
        recall, the ops, the share of groups whose rewards are all equal (no signal) per level, and the
        timing split. Scores are means over items of each item's mean, so that data-parallel ranks
        (each with the same number of items) average to the single process's numbers."""
        def per_item(values_of) -> float:   # the mean over items of each item's mean
            return mean(mean(values_of(i)) for i in range(len(items)))

        out = {"reward_mean": per_item(lambda i: [t for u, t in zip(units, totals) if u[3][:2] == ("global", i)]),
               "local_reward_mean": mean(t for u, t in zip(units, totals) if u[3][0] == "local")}
        for part in units[0][2] if units else ():
            out[f"reward_{part}"] = per_item(lambda i: [u[2][part] for u in units if u[3][:2] == ("global", i)])
        for level in ("global", "local"):
            rewards: dict = {}
            for u, t in zip(units, totals):
                if u[3][0] == level:
                    rewards.setdefault(u[3], []).append(t)
            out[f"zero_var_{level}"] = mean(max(r) == min(r) for r in rewards.values())
            out[f"groups_{level}"] = len(rewards)
        final = per_item(lambda i: [s for per_episode in answered[i] for s in per_episode])
        lanes = [lane for per_item in episodes for lane in per_item]
        misses = [[evidence_misses(stored_turns(lane.bank), [qa for qs in items[i].credited for qa in qs],
                                   items[i].fact_turns) for lane in episodes[i]] for i in range(len(items))]
        n = len(outcomes) or 1
        events = Counter(e for o in outcomes for e in o.events)
        status = Counter(o.status for o in outcomes)
        out.update({f"{self.ctx.reward.kind}_final": final, "em_mean": final if self.ctx.reward.kind == "em" else 0.0,
                    "f1_mean": final if self.ctx.reward.kind == "f1" else 0.0,
                    "evidence_miss": mean(miss_rate(m) or 0.0 for m in misses),
                    "parse_failure_rate": status["parse_error"] / n,
                    "invalid_rate": (n - status["ok"] - status["parse_error"]) / n,
                    **{f"ops_{e.lower()}": events[e] / n for e in EVENTS},
                    "capped_rate": mean(o.truncated for o in outcomes),
                    "unfinished_rate": mean(not lane.finished for lane in lanes),
                    "final_memories": per_item(lambda i: [len(lane.bank) for lane in episodes[i]]),
                    "final_words": per_item(lambda i: [lane.words[-1] for lane in episodes[i] if lane.words]),
                    "episodes": len(lanes), "sessions": phase.sessions,
                    "gen_s": gen_s, "score_s": time.perf_counter() - t0 - gen_s,
                    "response_tokens": sum(g.response_tokens for g in groups), "completions": sum(map(len, groups)),
                    "prompts": len(groups),
                    "forks": forks, "bank_ops": sum(len(o.store_ops) for o in outcomes if o.applied)})
        return out

