"""Dynamic sampling (rollout.refill, rl/task/stages/calls.py): equal-reward groups are dropped and refilled with
informative groups of extra items, within the cap, the same way on every rerun of a step."""
import pytest

from memr1.engine.config.run import load_config
from memr1.memory_store import HashEmbedder
from memr1.rl.task.agents.answer import AnswerConfig
from memr1.rl.task.agents.manager import ManagerConfig
from memr1.rl.task.data import load_conversations
from memr1.rl.task.train_items import answer_items, oracle_bank
from memr1.rl.task.stages.calls import AnswerStage, StageConfig, informative, refill_items
from memr1.rl.task.turns import Task
from memr1.rl.task.stages.context import StageContext
from scripted import ScriptedGenerator

TASK = Task(manager=ManagerConfig(), answer=AnswerConfig(top_k_per_speaker=5, max_new_tokens=6))
PER_STEP = 4


@pytest.fixture(scope="module")
def items():
    convs = load_conversations(None, n=3, split="train")
    emb = HashEmbedder(32)
    return answer_items(convs, {c.sample_id: oracle_bank(None, c, emb) for c in convs}, seed=0), emb


def replier(items, solvable: set):
    """Completion 0 answers right, completion 1 wrong, on the questions in `solvable` (an informative
    group); elsewhere both answer wrong (equal rewards)."""
    by_question = {it.question.question: it for it in items}

    def reply(call, i, j, prompts):
        q = next(q for q in by_question if q in str(prompts[i]))
        return f"Answer: {by_question[q].question.answer}" if q in solvable and j == 0 else "Answer: zzz"
    return reply


def stage_and_generator(items, emb, solvable, refill):
    stage = AnswerStage(items, StageContext(emb, TASK), StageConfig(prompts_per_step=PER_STEP, group_size=2),
                        refill=refill)
    gen = ScriptedGenerator()
    reply = replier(items, solvable)
    gen.reply = lambda call, i, j: reply(call, i, j, gen.calls[call])
    return stage, gen


def test_refill_replaces_equal_reward_groups_with_informative_ones(items):
    its, emb = items
    solvable = {it.question.question for it in its[PER_STEP:]}        # the step's own 4 items teach nothing
    stage, gen = stage_and_generator(its, emb, solvable, refill=0)
    plain = stage.rollout(0, gen)
    assert not any(informative(g) for g in plain.batch.groups) and "refill_drawn" not in plain.metrics
    assert plain.metrics["informative_groups"] == 0    # counted without refill too (bench.e2e's skip-only row)
    stage, gen = stage_and_generator(its, emb, {it.question.question for it in its[:2]}, refill=0)
    assert stage.rollout(0, gen).metrics["informative_groups"] == 2
    stage, gen = stage_and_generator(its, emb, solvable, refill=12)
    got = stage.rollout(0, gen)
    assert len(got.batch.groups) == PER_STEP and all(informative(g) for g in got.batch.groups)
    m = got.metrics
    extra = [p for call in gen.calls[1:] for p in call]
    solved = sum(any(q in str(p) for q in solvable) for p in extra)   # the extra items that came out informative
    assert m["informative_groups"] == PER_STEP and len(extra) == m["refill_drawn"] <= 12
    assert m["refill_dropped"] == PER_STEP + m["refill_drawn"] - solved
    assert m["reward_mean"] == plain.metrics["reward_mean"]           # the logged reward is the step's own items'
    assert m["completions"] == 2 * (PER_STEP + m["refill_drawn"])     # the extra work is counted
    again, gen2 = stage_and_generator(its, emb, solvable, refill=12)
    assert [g.source for g in again.rollout(0, gen2).batch.groups] == [g.source for g in got.batch.groups]


def test_refill_stops_at_its_cap_and_keeps_the_step_when_nothing_is_informative(items):
    its, emb = items
    stage, gen = stage_and_generator(its, emb, set(), refill=6)
    got = stage.rollout(0, gen)
    assert got.metrics["refill_drawn"] == 6 and got.metrics["refill_dropped"] == PER_STEP + 6
    assert len(got.batch.groups) == PER_STEP and got.metrics["informative_groups"] == 0
    assert sum(len(c) for c in gen.calls) == PER_STEP + 6


def test_refill_draws_are_fixed_by_step_and_round():
    pool = list(range(100))
    assert refill_items(pool, 3, 4, 5, 0) == refill_items(pool, 3, 4, 5, 0)
    assert refill_items(pool, 3, 4, 5, 0) != refill_items(pool, 3, 9, 5, 0)
    assert refill_items(pool, 3, 4, 5, 0) != refill_items(pool, 3, 4, 5, 1)   # each rank its own draw


def test_the_config_turns_refill_on():
    cfg = load_config(None, ["rollout.refill=true", "rollout.refill_max_prompts=32"])
    assert cfg.rollout.refill and cfg.rollout.refill_max_prompts == 32


def test_the_dry_run_plan_counts_the_refills_worst_case():
    from memr1.engine.config.plan import plan_text
    from memr1.engine.config.run import load_config

    base = ['stages=["answer_warm", "answer", "answer_rs"]', "stage.answer.prompts_per_step=2", "stage.answer.group_size=2",
            "answer.max_new_tokens=10", "generator.model=/nonexistent"]
    text, _ = plan_text(load_config(None, base))
    assert "refill" not in text
    text, _ = plan_text(load_config(None, base + ["rollout.refill=true", "rollout.refill_max_prompts=3"]))
    lines = [line for line in text.splitlines() if "refill:" in line]
    assert len(lines) == 2 and all("up to 3 extra prompts a step, so at most 10 completions/step and 100 new "
                                   "tokens/step" in line for line in lines)
