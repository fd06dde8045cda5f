"""The two Memory-R1 stages as the loop sees them: a step number in, a scored TrainBatch out.

ManagerStage: each item's prompt (turn facts + retrieved memories) gets G completions; each
completion's ops go to its own O(1) fork of the item's bank; the frozen Answer Agent answers the
item's questions from every fork; reward = mean EM minus the format penalty.
AnswerStage: the prompt is a question with the top-k memories per speaker; reward = EM.
A frozen counterpart (the answer agent in stage 1) runs on its own Generator.

Data parallel: a stage built with `rank`/`world` rolls out only its rank's contiguous slice of each
step's prompts (`rank_items`); the loop's gather joins the slices back into the global batch in rank
order, so the global batch is the one a single process would have drawn.
"""
import time
from collections import Counter

import msgspec
import torch

from memr1.engine.generation import SamplingConfig
from memr1.engine.learner import TrainBatch
from memr1.engine.loop import Rollout
from memr1.memory_store import BankError
from memr1.rl.agents.answer import AnswerConfig, build_answer_messages, parse_answer
from memr1.rl.agents.manager import (ManagerConfig, build_manager_prompt, memories_for_facts, parse_manager_output,
                                     to_store_ops)
from memr1.rl.items import step_items
from memr1.rl.rewards import exact_match


class StageConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    prompts_per_step: int = 4
    group_size: int = 4             # G completions per prompt (the GRPO group); rollouts use RunConfig.sampling
    frozen_sampling: SamplingConfig = msgspec.field(  # the frozen counterpart answers greedily
        default_factory=lambda: SamplingConfig(temperature=0.0, max_new_tokens=48))


def world_problem(prompts_per_step: int, world: int) -> str | None:
    """Why `world` data-parallel ranks can't share each step's prompts (each rolls out whole groups)."""
    if prompts_per_step % world:
        return (f"stage.prompts_per_step={prompts_per_step} does not divide over {world} data-parallel ranks "
                f"(torchrun --nproc_per_node); use a multiple of {world}")
    return None


def check_world(prompts_per_step: int, world: int) -> None:
    if problem := world_problem(prompts_per_step, world):
        raise ValueError(problem)


def rank_items(items: list, step: int, per_step: int, rank: int = 0, world: int = 1) -> list:
    """This rank's contiguous share of the items of `step` (all of them at world 1)."""
    check_world(per_step, world)
    share = per_step // world
    return step_items(items, step, per_step)[rank * share:(rank + 1) * share]


def to_train_batch(completions: list[list], rewards: list[list[float]], version: int) -> TrainBatch:
    """Prompt + response token ids per completion; loss only on the response; group = prompt."""
    ids, masks, behav, flat_rewards, groups = [], [], [], [], []
    for g, (group, group_rewards) in enumerate(zip(completions, rewards)):
        for c, r in zip(group, group_rewards):
            p, n = len(c.prompt_token_ids), len(c.token_ids)
            ids.append(torch.tensor(c.prompt_token_ids + c.token_ids, dtype=torch.long))
            masks.append(torch.cat([torch.zeros(p, dtype=torch.bool), torch.ones(n, dtype=torch.bool)]))
            behav.append(torch.cat([torch.zeros(p), torch.tensor(c.logprobs, dtype=torch.float32)]))
            flat_rewards.append(r)
            groups.append(g)
    return TrainBatch(input_ids=ids, response_mask=masks, behav_logp=behav,
                      rewards=torch.tensor(flat_rewards, dtype=torch.float32),
                      group_ids=torch.tensor(groups, dtype=torch.long), weight_version=version)


def answer_prompts(bank, questions: list[str], vectors, speakers, cfg: AnswerConfig) -> list[list[dict]]:
    """One answer prompt per question: the question and its top-k memories per speaker from `bank`."""
    return [build_answer_messages(q, {s: bank.items_for_prompt(v, k=cfg.top_k_per_speaker, speaker=s)
                                      for s in speakers}, cfg) for q, v in zip(questions, vectors)]


class ManagerStage:
    name = "manager"

    def __init__(self, items, frozen_answer, embedder, cfg: StageConfig, sampling: SamplingConfig,
                 manager: ManagerConfig, answer: AnswerConfig, rank: int = 0, world: int = 1):
        check_world(cfg.prompts_per_step, world)
        self.items, self.frozen, self.embedder = items, frozen_answer, embedder
        self.cfg, self.sampling, self.manager, self.answer = cfg, sampling, manager, answer
        self.rank, self.world = rank, world

    def rollout(self, step: int, generator) -> Rollout:
        t0 = time.perf_counter()
        items = rank_items(self.items, step, self.cfg.prompts_per_step, self.rank, self.world)
        prompts = []
        for it in items:
            memories = memories_for_facts(it.bank, self.embedder.embed(it.facts), self.manager.top_k)
            prompts.append(build_manager_prompt(it.facts, memories, it.speaker, it.timestamp))
        groups = generator.generate([p.messages for p in prompts], self.cfg.group_size, self.sampling)
        gen_s = time.perf_counter() - t0

        # Every completion edits its own fork; parse or apply failures leave the fork as it was.
        forks, penalties, ops_seen, failures = [], [], Counter(), 0
        for it, prompt, group in zip(items, prompts, groups):
            for c in group:
                ops, diag = parse_manager_output(c.text, len(prompt.bank_ids), self.manager)
                fork, penalty = it.bank.fork(), diag.penalty
                ops_seen.update(op.event for op in ops)
                try:
                    fork.apply_batch(to_store_ops(ops, prompt.bank_ids, self.embedder, it.speaker, it.timestamp))
                except BankError:
                    penalty += self.manager.format_penalty
                failures += diag.status == "parse_error"
                forks.append(fork)
                penalties.append(penalty)

        # The frozen Answer Agent answers each item's questions from each fork, in one generate call.
        requests, owners = [], []
        per_item = self.cfg.group_size
        questions = [[qa.question for qa in it.questions] for it in items]
        vectors = [self.embedder.embed(q) for q in questions]  # once per item, shared by its G forks
        for j, fork in enumerate(forks):
            i = j // per_item
            requests += answer_prompts(fork, questions[i], vectors[i], items[i].speakers, self.answer)
            owners += [(j, qa.answer) for qa in items[i].questions]
        answers = self.frozen.generate(requests, 1, self.cfg.frozen_sampling) if requests else []
        em = [[] for _ in forks]
        for (j, gold), out in zip(owners, answers):
            em[j].append(exact_match(parse_answer(out[0].text, self.answer).answer, gold))
        flat = [(sum(e) / len(e) if e else 0.0) - p for e, p in zip(em, penalties)]
        rewards = [flat[i * per_item:(i + 1) * per_item] for i in range(len(items))]
        n = len(forks)
        metrics = {"reward_mean": sum(flat) / n, "em_mean": sum(sum(e) / max(len(e), 1) for e in em) / n,
                   "parse_failure_rate": failures / n, "gen_s": gen_s,
                   "score_s": time.perf_counter() - t0 - gen_s,
                   "response_tokens": sum(len(c.token_ids) for g in groups for c in g),
                   **{f"ops_{k.lower()}": ops_seen.get(k, 0) / n for k in ("ADD", "UPDATE", "DELETE", "NONE")}}
        return Rollout(to_train_batch(groups, rewards, generator.weight_version), metrics)


class AnswerStage:
    name = "answer"

    def __init__(self, items, embedder, cfg: StageConfig, sampling: SamplingConfig, answer: AnswerConfig,
                 rank: int = 0, world: int = 1):
        check_world(cfg.prompts_per_step, world)
        self.items, self.embedder, self.cfg, self.sampling, self.answer = items, embedder, cfg, sampling, answer
        self.rank, self.world = rank, world

    def rollout(self, step: int, generator) -> Rollout:
        t0 = time.perf_counter()
        items = rank_items(self.items, step, self.cfg.prompts_per_step, self.rank, self.world)
        vectors = self.embedder.embed([it.question.question for it in items])
        prompts = [answer_prompts(it.bank, [it.question.question], [v], it.speakers, self.answer)[0]
                   for it, v in zip(items, vectors)]
        groups = generator.generate(prompts, self.cfg.group_size, self.sampling)
        gen_s = time.perf_counter() - t0
        parsed = [[parse_answer(c.text, self.answer) for c in g] for g in groups]
        rewards = [[exact_match(p.answer, it.question.answer) for p in ps] for it, ps in zip(items, parsed)]
        flat = [r for rs in rewards for r in rs]
        metrics = {"reward_mean": sum(flat) / len(flat), "em_mean": sum(flat) / len(flat), "gen_s": gen_s,
                   "score_s": time.perf_counter() - t0 - gen_s,
                   "parse_failure_rate": sum(not p.has_answer_tag for ps in parsed for p in ps) / len(flat),
                   "response_tokens": sum(len(c.token_ids) for g in groups for c in g)}
        return Rollout(to_train_batch(groups, rewards, generator.weight_version), metrics)
