"""Session-level rollouts (rl/task/episodes.py, rl/task/stages/episode.py): the items, the rewards, the per-level
advantages against a reference written the slow way, and re-rolls that start from their snapshot."""
import json
import random
import statistics

import msgspec
import pytest

from memr1.memory_store import Add, HashEmbedder, MemoryBank
from memr1.rl.task.data import load_conversations
from memr1.rl.task.stages.episode import EpisodeStage
from memr1.rl.task.episodes import (EpisodeConfig, Phase, compression_penalty, episode_items, global_sample, local_sample,
                               session_reward)
from memr1.rl.task.facts import oracle_facts
from memr1.rl.task.train_items import deciding_turn
from memr1.rl.task.stages.calls import StageConfig
from memr1.rl.task.turns import Task
from memr1.rl.algos.advantages import advantages
from memr1.rl.algos.config import GRPOConfig
from memr1.rl.records import Credit, Group, TrainBatch
from memr1.rl.task.agents.answer import AnswerConfig
from memr1.rl.task.agents.manager import ManagerConfig
from memr1.rl.task.stages.context import StageContext
from scripted import ScriptedGenerator

CONVS = load_conversations(None, 10, split="train")
FACTS = {c.sample_id: oracle_facts(c) for c in CONVS}


def test_items_credit_each_question_to_the_session_that_decides_it():
    items = episode_items(CONVS, FACTS, 2, sessions=2)
    assert items
    for it in items:
        order = {t.dia_id: i for i, t in enumerate(it.conv.turns())}
        assert len(it.calls) == len(it.session_words) == min(2, len(it.conv.sessions))
        for k, qs in enumerate(it.credited):
            for qa in qs:
                turn = it.conv.turns()[deciding_turn(qa, order, FACTS[it.conv.sample_id])]
                assert it.session_of[turn.dia_id] == k
                assert all(e in it.session_of for e in qa.evidence if e in order)   # all inside the window
        for k, calls in enumerate(it.calls):
            assert all(it.session_of[d] == k for c in calls for d in c["dia_ids"])
        assert it.session_words == sorted(it.session_words)   # cumulative
    # a longer window holds at least the questions of a shorter one
    longer = {it.conv.sample_id: it for it in episode_items(CONVS, FACTS, 2, sessions=4)}
    for it in items:
        assert sum(map(len, it.credited)) <= sum(map(len, longer[it.conv.sample_id].credited))


def test_question_samples_are_capped_and_local_ones_put_the_session_first():
    it = max(episode_items(CONVS, FACTS, 2, sessions=4), key=lambda i: sum(map(len, i.credited)))
    pairs = global_sample(it, 3, random.Random(0))
    assert len(pairs) == 3 and [k for k, _ in pairs] == sorted(k for k, _ in pairs)
    k = max(range(len(it.credited)), key=lambda j: len(it.credited[j]))
    local = local_sample(it, k, 100, random.Random(1))
    n = len(it.credited[k])
    assert {id(q) for q in local[:n]} == {id(q) for q in it.credited[k]}
    assert all(any(q is x for j in range(k) for x in it.credited[j]) for q in local[n:])


def test_compression_penalty_has_a_free_zone_and_unfinished_episodes_score_zero():
    assert compression_penalty(70, 100, 0.2, 0.7) == 0.0
    assert compression_penalty(120, 100, 0.2, 0.7) == pytest.approx(0.2 * 50 / 100)
    assert compression_penalty(500, 100, 0.0, 0.7) == 0.0
    parts = session_reward([1.0, 0.0], 120, 100, "em", 0.2, 0.7)
    assert parts == {"em": 0.5, "compression": pytest.approx(-0.1)}
    assert session_reward([1.0], 500, 100, "em", 0.2, 0.7, finished=False) == {"em": 0.0, "compression": 0.0}


def slow_advantages(rewards, groups, weights, eps=1e-6):
    out = []
    for r, g, w in zip(rewards, groups, weights):
        mine = [x for x, h in zip(rewards, groups) if h == g]
        if len(mine) < 2:
            out.append(0.0)
            continue
        std = statistics.stdev(mine)
        out.append(w * (r - statistics.mean(mine)) / (std + eps))
    return out


def test_level_credit_matches_the_slow_reference():
    rng = random.Random(3)
    groups = [rng.randrange(7) for _ in range(60)]   # 7 groups across two levels, one a singleton
    groups.append(7)
    rewards = [rng.choice([0.0, 0.25, 0.5, 1.0]) - 0.1 * rng.random() for _ in groups]
    weights = [1.0 if g < 4 else 0.5 for g in groups]
    # one call per unit, each its own one-response group, as the episode stage's credit says
    batch = TrainBatch([Group([1], [[2]], None, [r], credit=[Credit("global" if g < 4 else "local", g, n, w)])
                        for n, (r, g, w) in enumerate(zip(rewards, groups, weights))])
    got = advantages(batch, GRPOConfig()).tolist()
    assert got == pytest.approx(slow_advantages(rewards, groups, weights), abs=1e-5)
    assert got[-1] == 0.0   # the singleton


def note(call, i, j):
    """Every lane writes its own ADD, so lanes' banks (and their later prompts) differ."""
    return json.dumps({"memory": [{"id": "90", "text": f"note {call}-{i}", "event": "ADD"}]})


def stage_for(items, policy_cfg=None, **episode):
    embedder = HashEmbedder(64)
    task = Task(manager=ManagerConfig(top_k=5, turns_per_call=2, max_new_tokens=64),
                answer=AnswerConfig(max_new_tokens=4, distill=False))
    cfg = EpisodeConfig(**{"sessions": 2, "inner_n": 3, "reroll_prob": 1.0, **episode})
    frozen = ScriptedGenerator(["Answer: none"])
    return EpisodeStage(lambda s: items, frozen, StageContext(embedder, task),
                        StageConfig(steps=1, prompts_per_step=1, group_size=4), cfg)


def test_a_reroll_starts_from_its_episodes_snapshot_and_never_changes_it():
    # a window where both speakers talk in both sessions, so every lane enters session 2 with memories
    items = [next(it for it in episode_items(CONVS, FACTS, 2, sessions=2)
                  if all({c["speaker"] for c in calls} == set(it.speakers) for calls in it.calls))]
    policy = ScriptedGenerator(reply=note)
    rollout = stage_for(items).rollout(0, policy)
    first = len(items[0].calls[0])
    # the first call of session 2: the 4 episodes' prompts, then the 3 re-rolls'
    episodes, rerolls = policy.calls[first][:4], policy.calls[first][4:]
    assert len(rerolls) == 3 and len({json.dumps(p) for p in episodes}) == 4   # the episodes' banks differ
    assert all(r == rerolls[0] for r in rerolls) and rerolls[0] in episodes    # each re-roll sees one episode's bank
    # what the re-rolls wrote never reaches an episode: its later prompts show none of their notes
    written = {f"note {c}-{i}" for c in range(first, len(policy.calls)) for i in range(4, len(policy.calls[c]))}
    later = json.dumps([call[:4] for call in policy.calls[first + 1:]])
    assert written and not any(w in later for w in written)
    m = rollout.metrics
    assert m["groups_local"] == 2 and m["groups_global"] == 2 and m["episodes"] == 4
    groups, calls = rollout.batch.groups, [len(c) for c in items[0].calls]
    assert m["completions"] == sum(map(len, groups)) == (4 + 3) * sum(calls)   # every call of every lane
    # calls with one prompt are one group: session 1's first call of each speaker (all 7 lanes still
    # hold none of that speaker's memories), and in session 2 the same for the re-rolls and the episode
    # they forked; every other call's lanes hold different notes
    assert len({tuple(g.prompt_ids) for g in groups}) == len(groups) == m["prompts"]
    assert sorted(len(g) for g in groups if len(g) > 1) == [4, 4, 7, 7]
    assert m["final_memories"] == sum(calls)   # one ADD per call of its own, none of the re-rolls'
    assert m["bank_ops"] == (4 + 3) * sum(calls)   # both sessions re-rolled (reroll_prob 1)
    assert all(g.credit is not None and g.advantages is None for g in rollout.batch.groups)   # the route's job


def test_a_snapshot_fork_holds_the_episode_as_it_was():
    embedder = HashEmbedder(16)
    bank = MemoryBank.create(None, dim=16)
    for t in ("a", "b", "c"):
        bank.apply(Add(t, embedder.embed([t])[0], "S", ""))
    before = [(m.id, m.text) for m in bank]
    snapshot = bank.fork()
    rerolls = [snapshot.fork() for _ in range(3)]
    bank.apply(Add("d", embedder.embed(["d"])[0], "S", ""))            # the episode goes on
    for j, r in enumerate(rerolls):
        assert [(m.id, m.text) for m in r] == before                   # same memories and ids as at k - 1
        r.apply(Add(f"r{j}", embedder.embed([f"r{j}"])[0], "S", ""))
    assert [m.text for m in bank] == ["a", "b", "c", "d"]              # the re-rolls never reach the source
    assert [(m.id, m.text) for m in snapshot] == before


def test_evidence_miss_reads_the_source_turns_memories_carry():
    """A manager that ADDs at every call keeps every needed turn (miss 0, each memory naming its
    call's turns); one that writes nothing misses every counted question (miss 1)."""
    items = episode_items(CONVS, FACTS, 2, sessions=2)[:1]
    policy = ScriptedGenerator(reply=note)   # one ADD per call
    stage = stage_for(items, reroll_prob=0.0)
    keep = []
    stage.answer_final = lambda its, episodes, samples: keep.append(episodes) or [
        [[0.0] * len(samples[i]) for _ in episodes[i]] for i in range(len(its))]
    assert stage.rollout(0, policy).metrics["evidence_miss"] == 0.0
    calls = {tuple(c["dia_ids"]) for it in items for cs in it.calls for c in cs}
    assert {m.sources for lanes in keep[0] for lane in lanes for m in lane.bank} == calls
    silent = stage_for(items, reroll_prob=0.0).rollout(0, ScriptedGenerator(['{"memory": []}'])).metrics
    assert silent["evidence_miss"] == 1.0 and silent["final_memories"] == 0
