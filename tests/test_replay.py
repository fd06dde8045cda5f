"""`memr1 train --from-rollouts` (engine/replay.py): the groups read back from shards are the groups the
stage rolled out, across ranks; the learner's step on them is the step on the online batch; shards of
another stage, base model or tokenizer, and folders with nothing finished, are refused in one line; and
the command trains the recorded stage, a step per recorded step."""
import json
import math
import os

import msgspec
import pytest
import torch

from memr1.engine.checkpoints.files import tokenizer_digest, weights_digest
from memr1.engine.config.errors import ConfigError
from memr1.engine.replay import ReplayStage, check_models, configure, load, read_recording
from memr1.engine.rollout_files import open_dir, write_shard
from memr1.memory_store import HashEmbedder
from memr1.rl.records import Group, Rollout, Sample, TrainBatch
from memr1.rl.task.data import load_conversations
from memr1.rl.task.facts import oracle_facts
from memr1.rl.task.stages.calls import ManagerStage, StageConfig
from memr1.rl.task.stages.context import StageContext
from memr1.rl.task.train_items import ItemsConfig, manager_calls, manager_items, oracle_bank
from memr1.rl.task.turns import Task
from memr1.rl.task.agents.answer import AnswerConfig
from memr1.rl.task.agents.manager import ManagerConfig
from learner_helpers import make_batch
from scripted import ScriptedGenerator

TASK = Task(manager=ManagerConfig(top_k=5, turns_per_call=2, max_new_tokens=64),
            answer=AnswerConfig(max_new_tokens=4, distill=False))


def manifest(out, stage="manager", world=1, base="b" * 64, tokenizer="t" * 64):
    open_dir(out, {"stage": stage, "world": world, "tokenizer": tokenizer, "models": {"base": base}}, None)


def reply(call, i, j):
    event = ("ADD", "NONE", "bad")[j % 3]
    return "no json" if event == "bad" else json.dumps({"memory": [{"id": "90", "text": f"f{i}{j}", "event": event}]})


def manager_rollouts(steps=2, per_step=4):
    embedder = HashEmbedder(64)
    convs = load_conversations(None, n=3, split="train")
    specs = manager_calls(convs, {c.sample_id: oracle_facts(c) for c in convs}, 2)
    items = manager_items(specs, [oracle_bank(s, s.conv, embedder) for s in specs], ItemsConfig(), 0)
    stage = ManagerStage(items, ScriptedGenerator(["Answer: none"]), StageContext(embedder, TASK),
                         StageConfig(prompts_per_step=per_step, group_size=3))
    return [stage.rollout(s, ScriptedGenerator(reply=reply)) for s in range(steps)]


def same_groups(got: list[Group], want: list[Group]):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert (a.prompt_ids, a.responses, a.rewards, a.truncated, a.source) == \
            (b.prompt_ids, b.responses, b.rewards, b.truncated, b.source)
        assert a.breakdown == b.breakdown and a.credit is None
        assert [x for lp in a.behav_logprobs for x in lp] == pytest.approx([x for lp in b.behav_logprobs for x in lp],
                                                                          abs=1e-6)


def test_replayed_groups_are_the_groups_the_stage_rolled_out_rank_by_rank(tmp_path):
    # two ranks' shards of two steps: a replayed step is rank 0's groups, then rank 1's
    per_rank = [manager_rollouts(), manager_rollouts(per_step=2)]
    manifest(tmp_path, world=2)
    for rank, rolls in enumerate(per_rank):
        for step, r in enumerate(rolls):
            write_shard(tmp_path, step, rank, r, 1.0)
    rec = read_recording([str(tmp_path)])
    assert rec.stage == "manager" and [s.step for s in rec.steps] == [0, 1]
    one = ReplayStage("manager", rec.steps)
    for step in (0, 1):
        got = one.rollout(step, None)
        same_groups(got.batch.groups, per_rank[0][step].batch.groups + per_rank[1][step].batch.groups)
        assert got.metrics["reward_mean"] == pytest.approx(
            sum(sum(g.rewards) for g in got.batch.groups) / got.batch.num_seqs)
    # under two training ranks each trains every other group of the step
    halves = [ReplayStage("manager", rec.steps, r, 2).rollout(0, None).batch.groups for r in (0, 1)]
    same_groups(halves[0] + halves[1], one.rollout(0, None).batch.groups[0::2] + one.rollout(0, None).batch.groups[1::2])


def test_a_step_some_rank_has_not_finished_is_left_out(tmp_path):
    rolls = manager_rollouts(steps=2)
    manifest(tmp_path, world=2)
    write_shard(tmp_path, 0, 0, rolls[0], 1.0)
    write_shard(tmp_path, 0, 1, rolls[0], 1.0)
    write_shard(tmp_path, 1, 0, rolls[1], 1.0)   # rank 1 never finished step 1
    assert [s.step for s in read_recording([str(tmp_path)]).steps] == [0]
    (tmp_path / "completions-s000000-r1.parquet").write_bytes(b"torn")   # a shard no longer whole
    with pytest.raises(ConfigError, match="no step there is finished on every rank"):
        read_recording([str(tmp_path)])


def synthetic_rollout(seed: int) -> Rollout:
    batch = make_batch(seed, groups=3, size=3)
    for g in batch.groups:   # behaviour log-probs a float32 column cannot hold exactly
        g.behav_logprobs = [[x + 1e-9 for x in lp] for lp in g.behav_logprobs]
        g.breakdown = {"em": list(g.rewards)}
    samples = [Sample(group=i, index=j, item=g.source, conversation="c", text="t")
               for i, g in enumerate(batch.groups) for j in range(len(g))]
    return Rollout(batch, {}, samples)


@pytest.mark.parametrize("anchor", ["current", "behaviour"])
def test_the_learners_step_on_replayed_shards_is_its_step_on_the_online_batch(tiny, tmp_path, anchor):
    from memr1.engine.training.config import LearnerConfig
    from memr1.engine.training.learner import Learner

    online = synthetic_rollout(3)
    manifest(tmp_path, stage="answer")
    write_shard(tmp_path, 0, 0, online, 1.0)
    replayed = ReplayStage("answer", read_recording([str(tmp_path)]).steps).rollout(0, None)
    results = []
    for batch in (online.batch, replayed.batch):
        torch.manual_seed(0)
        learner = Learner(LearnerConfig(anchor=anchor), tiny, lr=1e-3)
        m = learner.train_step(batch)
        results.append((m, {n: p.detach().clone() for n, p in learner.policy.lm.named_parameters()}))
    (a, wa), (b, wb) = results
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-7)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    assert all(torch.allclose(wa[n], wb[n], atol=1e-6) for n in wa)


def test_folders_of_other_stages_or_models_are_refused_in_one_line(tmp_path, tiny):
    rolls = manager_rollouts(steps=1)
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    manifest(a)
    write_shard(a, 0, 0, rolls[0], 1.0)
    manifest(b, stage="answer")
    write_shard(b, 0, 0, rolls[0], 1.0)
    manifest(c, stage="manager_episode")
    write_shard(c, 0, 0, rolls[0], 1.0)
    cases = [([str(a), str(b)], "written for stage answer, but"), ([str(c)], "episode shards keep no credit"),
             ([str(tmp_path / "none")], "not a folder"), ([], "at least one rollout folder")]
    for folders, what in cases:
        with pytest.raises(ConfigError, match=what) as e:
            read_recording(folders)
        assert "\n" not in str(e.value)
    empty = tmp_path / "empty"
    manifest(empty)
    with pytest.raises(ConfigError, match="no step there is finished"):
        read_recording([str(empty)])
    # the base model's weights and the tokenizer, each against the manifest's digest
    ours = tmp_path / "ours"
    manifest(ours, base=weights_digest(tiny), tokenizer=tokenizer_digest(tiny))
    write_shard(ours, 0, 0, rolls[0], 1.0)
    check_models(read_recording([str(ours)]), tiny, say=lambda *x: None)
    with pytest.raises(ConfigError, match="another base model"):
        check_models(read_recording([str(a)]), tiny)
    other_tok = tmp_path / "tok"
    manifest(other_tok, base=weights_digest(tiny))
    write_shard(other_tok, 0, 0, rolls[0], 1.0)
    with pytest.raises(ConfigError, match="another tokenizer"):
        check_models(read_recording([str(other_tok)]), tiny)


def test_configure_trains_the_recorded_stage_a_step_per_recorded_step(tmp_path):
    from memr1.engine.config.run import load_config

    rolls = manager_rollouts(steps=3)
    manifest(tmp_path)
    for s, r in enumerate(rolls):
        write_shard(tmp_path, s, 0, r, 1.0)
    cfg = load_config("configs/default.toml", ['stages=["answer_warm", "answer"]',
                                               f"rollout.replay={json.dumps([str(tmp_path)])}"])
    rec = load(cfg)
    assert [s.step for s in rec.steps] == [0, 1, 2]
    got = configure(cfg, rec)
    assert got.stages == ["manager"] and got.stage.manager.steps == 3
    from memr1.engine.config.plan import plan_text
    assert "manager           3 recorded steps replayed from" in plan_text(got)[0]
    plain = msgspec.structs.replace(cfg, rollout=msgspec.structs.replace(cfg.rollout, replay=()))
    assert configure(got, load(got)) == got and load(plain) is None and configure(plain, load(plain)).stages == [
        "answer_warm", "answer"]


@pytest.mark.slow
def test_the_command_trains_on_what_memr1_rollout_recorded(tiny_model, tmp_path, monkeypatch):
    """`memr1 rollout` on the tiny model, then `memr1 train --from-rollouts`: one answer step per recorded
    step, each training on the recorded groups."""
    from memr1.engine.cli import main
    from run_helpers import overrides, rows

    monkeypatch.chdir(os.path.dirname(os.path.dirname(__file__)))
    rec_dir, run_dir = tmp_path / "rollouts", tmp_path / "run"
    args = overrides(tiny_model, rec_dir, 1, ("answer",)) + ["items.answer_banks=oracle", "stage.answer.group_size=3"]
    assert main(["rollout", "--config", "configs/default.toml", "--stage", "answer", "--split", "train",
                 "--items", "4", "--out", str(rec_dir), *args]) == 0
    train_args = overrides(tiny_model, run_dir, 1, ("manager", "answer")) + ["items.answer_banks=oracle", "eval_after=[]"]
    assert main(["train", "--config", "configs/default.toml", *train_args, "--from-rollouts", str(rec_dir)]) == 0
    steps = [r for r in rows(run_dir) if r.get("stage") == "answer" and "replayed_step" in r]
    assert [r["replayed_step"] for r in steps] == [0, 1] and all(r["groups"] == 2 for r in steps)
    assert not any(r.get("stage") == "manager" for r in rows(run_dir))
    assert math.isfinite(steps[-1]["loss"])
