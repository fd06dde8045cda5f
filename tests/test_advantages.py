"""rl/algos/advantages.py, the one route from rewards to advantages: for each stage kind (call-level
manager and answer RL, episodes with two weighted levels, warm start, rejection sampling) it gives bit
for bit what the computation before it gave (kept below as a small reference), every stage kind's
batch reaches the learner through it, and nothing else in rl/ or engine/ computes GRPO advantages."""
import ast
from pathlib import Path

import pytest
import torch

from advantage_cases import KINDS, batches
from memr1.rl.algos.advantages import advantages
from memr1.rl.algos.config import GRPOConfig
from memr1.rl.algos.grpo import grpo_advantages
from memr1.rl.records import Credit, Group, TrainBatch

ROOT = Path(__file__).resolve().parents[1]
CFGS = [GRPOConfig(), GRPOConfig(std="population", baseline="loo"), GRPOConfig(std="none", eps=1e-3)]


@pytest.fixture(scope="module")
def cases():
    return batches()


# -- the computations before the one route, kept as they were -----------------------------------------
def learner_grpo(batch, cfg):
    """The learner's `group_advantages`: GRPO within each Group."""
    rewards = torch.tensor([r for g in batch.groups for r in g.rewards], dtype=torch.float32)
    group_ids = torch.tensor([i for i, g in enumerate(batch.groups) for _ in g.responses])
    return grpo_advantages(rewards, group_ids, cfg, num_groups=len(batch.groups)).float().cpu()


def episode_level_advantages(rewards, group_ids, weights, cfg):
    """The episode stage's `level_advantages`, on its units in its order: Python floats."""
    adv = grpo_advantages(torch.tensor(rewards, dtype=torch.float32), torch.tensor(group_ids), cfg,
                          num_groups=max(group_ids) + 1)
    return [float(a) * w for a, w in zip(adv.tolist(), weights)]


def old_advantages(kind, batch, cfg):
    if kind in ("manager", "answer"):
        return learner_grpo(batch, cfg)
    if kind in ("warm", "rs"):   # the stages gave 1.0 to each kept reply; the learner read them
        return torch.tensor([1.0] * batch.num_seqs, dtype=torch.float32)
    # episodes: the stage's units (reward, group, weight) in its order, each unit's advantage given to
    # all of its calls, then read by the learner as float32
    flat = [(c, r) for g in batch.groups for c, r in zip(g.credit, g.rewards)]
    units = {c.unit: (r, c.group, c.weight) for c, r in sorted(flat, key=lambda x: x[0].unit)}
    adv = dict(zip(units, episode_level_advantages(*map(list, zip(*units.values())), cfg)))
    return torch.tensor([adv[c.unit] for c, _ in flat], dtype=torch.float32)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cfg", CFGS, ids=["unbiased", "population-loo", "none"])
def test_each_stage_kind_gets_the_advantages_it_got_before(cases, kind, cfg):
    batch = cases[kind]
    got, want = advantages(batch, cfg), old_advantages(kind, batch, cfg)
    assert got.dtype == torch.float32 and got.shape == (batch.num_seqs,)
    assert torch.equal(got, want)
    assert (got != 0).any()   # the cases carry signal, so the comparison means something


def test_episode_credit_counts_each_session_once_per_lane(cases):
    """An episode's unit (one lane's session) spans several calls: each appears once in its group, so a
    group holds the G episodes (or the inner_n re-rolls), whatever the number of calls."""
    members: dict[int, set] = {}
    for g in cases["episode"].groups:
        for c in g.credit:
            members.setdefault(c.group, set()).add(c.unit)
    levels = {c.group: c.level for g in cases["episode"].groups for c in g.credit}
    assert {len(units) for gid, units in members.items() if levels[gid] == "global"} == {4}   # group_size
    assert {len(units) for gid, units in members.items() if levels[gid] == "local"} == {3}    # inner_n
    assert {c.weight for g in cases["episode"].groups for c in g.credit} == {0.3, 0.7}


def test_one_batch_of_every_kind_gets_what_each_gets_alone(cases):
    """Fed a call-level, an episode (levels) and a warm-start batch at once, each part's advantages are
    its own: groups never mix across kinds."""
    kinds = ("manager", "episode", "warm", "answer")
    mixed = TrainBatch([g for k in kinds for g in cases[k].groups])
    alone = torch.cat([advantages(cases[k], GRPOConfig()) for k in kinds])
    assert torch.equal(advantages(mixed, GRPOConfig()), alone)


def test_a_unit_whose_responses_disagree_is_refused():
    one = dict(prompt_ids=[1], responses=[[2], [3]], behav_logprobs=None)
    bad = TrainBatch([Group(**one, rewards=[1.0, 0.0], credit=[Credit("global", 0, 5), Credit("global", 0, 5)])])
    with pytest.raises(ValueError, match="unit 5"):
        advantages(bad, GRPOConfig())
    assert advantages(TrainBatch([]), GRPOConfig()).shape == (0,)


def test_stages_emit_rewards_and_credit_never_advantages(cases):
    """RL stages leave every advantage to the route (the groups fix none); supervised ones mark targets."""
    for kind in ("manager", "answer", "episode"):
        assert all(g.advantages is None for g in cases[kind].groups)
    for kind in ("warm", "rs"):
        assert all(c.level == "target" for g in cases[kind].groups for c in g.credit)


def test_the_learner_takes_every_stage_kinds_advantages_from_the_route(cases, tiny, monkeypatch):
    """With the route replaced by a spy that returns marked values, the learner's plan carries exactly
    those for every stage kind: no other computation reaches the loss."""
    from memr1.engine.training import learner as learner_module
    from memr1.engine.training.config import LearnerConfig

    seen = []

    def spy(batch, cfg):
        seen.append(batch)
        return torch.arange(1, batch.num_seqs + 1, dtype=torch.float32)   # nonzero: no group is dropped

    monkeypatch.setattr(learner_module, "advantages", spy)
    learner = learner_module.Learner(LearnerConfig(), tiny, lr=1e-5)
    for kind in KINDS:
        plan = learner.plan(cases[kind])
        assert seen[-1] is cases[kind]
        assert torch.equal(plan.seq_adv, torch.arange(1, cases[kind].num_seqs + 1, dtype=torch.float32))
    assert len(seen) == len(KINDS)


def test_only_the_route_computes_grpo_advantages():
    """In rl/ and engine/, GRPO's normalisation (grpo_advantages, kernels.grpo_advantage) is called by
    rl/algos/advantages.py alone, and the route by the learner alone."""
    callers: dict[str, set] = {"grpo_advantages": set(), "grpo_advantage": set(), "advantages": set()}
    for layer in ("rl", "engine"):
        for path in (ROOT / layer).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call):
                    f = node.func
                    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                    if name in callers:
                        callers[name].add(str(path.relative_to(ROOT)))
    assert callers == {"grpo_advantages": {"rl/algos/advantages.py"}, "grpo_advantage": {"rl/algos/grpo.py"},
                       "advantages": {"engine/training/learner.py"}}
