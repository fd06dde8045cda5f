"""The outcome-only recipe (configs/outcome.toml): format starts from a pool of their own, rejection
sampling on the RL stage's own rollouts, the probe curve, ADD-every-fact banks, and no oracle label of
the run's data set anywhere in training."""
import json

import pytest

from memr1.engine.config.run import load_config
from memr1.engine.config.stages import stage_config, stage_name
from memr1.rl.algos.rejection import best_of, rejection_batch
from memr1.rl.records import Group, Rollout, TrainBatch
from run_helpers import overrides, rows


def group(rewards, source="g"):
    n = len(rewards)
    return Group(prompt_ids=[1, 2], responses=[[10 + i, 20 + i] for i in range(n)],
                 behav_logprobs=[[-1.0, -1.0]] * n, rewards=list(rewards), breakdown={"em": list(rewards)},
                 truncated=[False] * n, source=source)


def test_rejection_keeps_each_groups_best_positive_completion_as_a_supervised_target():
    batch = TrainBatch([group([0.0, 1.0, 0.5, 1.0], "a"), group([0.0, -1.0], "b"), group([0.0, 0.2], "c")], 3)
    out = rejection_batch(Rollout(batch, {"reward_mean": 0.1}, step=4, weight_version=3))
    assert [g.source for g in out.batch.groups] == ["a", "c"]           # b has no positive reward: skipped
    a, c = out.batch.groups
    assert a.responses == [[11, 21]] and c.responses == [[11, 21]]      # the best; ties go to the first sampled
    assert a.advantages == [1.0] and a.behav_logprobs is None            # the supervised loss, ratio 1
    assert a.breakdown == {"em": [1.0]} and out.batch.weight_version == 3
    assert out.metrics == {"reward_mean": 0.1, "rs_kept": 2 / 3} and out.step == 4


def test_rejection_with_no_positive_group_trains_nothing():
    out = rejection_batch(Rollout(TrainBatch([group([0.0, 0.0]), group([-1.0, 0.0])])))
    assert best_of(group([0.0, 0.0])) is None
    assert len(out.batch.groups) == 1 and out.batch.groups[0].advantages == [0.0] and out.metrics["rs_kept"] == 0


def test_rs_stages_take_their_rl_stages_rollouts_and_their_own_lr():
    cfg = load_config("configs/outcome.toml", ["stage.answer_rs.lr=2e-5"])
    n = stage_name("answer_rs")
    assert n.baseline and n.supervised and not n.scripted and n.of("rl") == "answer"
    rs, rl = stage_config(cfg, "answer_rs"), stage_config(cfg, "answer")
    assert (rs.steps, rs.prompts_per_step, rs.group_size, rs.lr) == (rl.steps, rl.prompts_per_step, rl.group_size, 2e-5)
    assert stage_config(cfg, "manager_rs").lr == cfg.stage.manager.lr    # unset: the RL stage's


def test_the_outcome_recipe_reads_no_oracle_bank_or_guard_of_its_data():
    cfg = load_config("configs/outcome.toml")
    assert cfg.items.bank_pipeline == cfg.items.answer_banks == "manager" and cfg.items.guard_questions == 0
    for role in ("manager", "answer"):
        warm = getattr(cfg.stage, f"{role}_warm")
        assert warm.examples <= 16 and warm.pool_seed is not None and warm.pool_seed != cfg.data.seed
    assert cfg.loop.probe_every and cfg.loop.probe_items >= 64 and "add_all" in cfg.eval_after


def test_the_outcome_recipe_plans_on_a_locomo_file_with_no_oracle_fields(tmp_path, capsys):
    from memr1.engine.cli import main
    from memr1.rl.task.data.synthetic import synthesize
    data = synthesize(10, seed=7)
    for conv in data:
        for key in [k for k in conv if k not in ("sample_id", "conversation", "qa")]:
            conv.pop(key)
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps(data))
    assert "oracle" not in path.read_text()
    code = main(["train", "--config", "configs/outcome.toml", "--dry-run", f"data.path={path}", "extract.source=model",
                 f"run_dir={tmp_path / 'run'}"])
    assert code == 0, capsys.readouterr()
    assert "manager_warm" in capsys.readouterr().out


@pytest.mark.slow
def test_outcome_recipe_with_its_controls_end_to_end(tiny_model, tmp_path, monkeypatch):
    """Format starts from the pool, then answer, answer_rs, manager, manager_rs on the run's data: the
    RS stages train on exactly their RL stages' prompts (one kept completion a group at most), each
    RL-family stage logs the probe curve from step 0, the controls hand on nothing, and nothing in
    training reads an oracle bank, op or guard of the run's own conversations."""
    from memr1.engine import items as items_mod, stage_driver, train as train_mod
    sources: dict[str, list] = {}
    oracle_reads: list[str] = []

    class Recording(stage_driver.Learner):
        def train_step(self, batch):
            sources.setdefault(self.recording, []).append([(g.source, len(g)) for g in batch.groups])
            return super().train_step(batch)

    real_stage = train_mod.train_stage

    def stage_named(run, name, *a, **k):
        Recording.recording = name
        return real_stage(run, name, *a, **k)

    def spy(module, fn, sid):
        real = getattr(module, fn)

        def wrapped(*a, **k):
            oracle_reads.append(sid(*a))
            return real(*a, **k)
        monkeypatch.setattr(module, fn, wrapped)
    spy(items_mod, "oracle_banks", lambda specs, *_: ",".join(s.conv.sample_id for s in specs))
    spy(items_mod, "oracle_bank", lambda spec, conv, *_: conv.sample_id)
    monkeypatch.setattr(stage_driver, "Learner", Recording)
    monkeypatch.setattr(train_mod, "train_stage", stage_named)
    run = tmp_path / "run"
    stages = ("manager_warm", "answer_warm", "answer", "answer_rs", "manager", "manager_rs")
    cfg = load_config("configs/outcome.toml", overrides(tiny_model, run, 2, stages) + [
        'eval_after=["base", "warm", "trained", "rs", "add_all"]', "eval_split=train", f"cache_dir={tmp_path / 'c'}",
        "eval.max_turns=6", "eval.max_questions=1", "eval.resamples=100", "items.window_turns=4",
        "stage.manager_warm.examples=3", "stage.answer_warm.examples=3", "stage.manager_warm.pool_seed=1000",
        "loop.probe_every=1", "loop.probe_items=2", "loop.max_staleness=0", "data.n=10", "learner.train_layers=2",
        "learner.cpu_precision=fp32", "generator.dtype=auto"])
    out = train_mod.train(cfg)
    assert out["stopped"] is None
    got = rows(run)
    for rl, rs in (("answer", "answer_rs"), ("manager", "manager_rs")):
        kept = [r["rs_kept"] for r in got if r["stage"] == rs and "loss" in r]
        assert len(kept) == 2
        rl_src = [{s for s, _ in step} for step in sources[rl]]
        for step, rl_step in zip(sources[rs], rl_src):
            assert all(n == 1 for _, n in step)                               # one completion a kept group
            assert {s for s, _ in step} <= rl_step                            # of the RL stage's own prompts
        probes = [(r["step"], r["probe_reward_mean"]) for r in got if r["stage"] in (rl, rs) and "probe_reward_mean" in r]
        assert [s for s, _ in probes] == [0, 1, 2, 0, 1, 2]
    assert all(s.startswith("synth-1000-") for s in {x.split()[0] for st in sources["manager_warm"] for x, _ in st})
    assert all(s.startswith("synth-1000-") for s in {x.split()[0] for st in sources["answer_warm"] for x, _ in st})
    assert oracle_reads and all(s.startswith("synth-1000-") for r in oracle_reads for s in r.split(",")), oracle_reads
    evals = {k: v for k, v in out["evals"].items()}
    assert "rs" in evals and "trained_answer.add_all_manager" in evals
    rs = json.loads((run / "eval" / "train.rs.json").read_text())["models"]
    assert "manager_rs/checkpoints" in rs["manager"] and "answer_rs/checkpoints" in rs["answer"]
    trained = json.loads((run / "eval" / "train.trained.json").read_text())["models"]
    assert "rs" not in trained["manager"] and "rs" not in trained["answer"]   # controls hand on nothing
    add_all = json.loads((run / "eval" / "train.trained_answer.add_all_manager.json").read_text())
    assert add_all["config"]["baseline"] == "add_all" and not add_all["manager"]
    summary = json.loads((run / "eval" / "summary.json").read_text())["comparisons"]
    assert "trained - rs" in summary and "trained - trained_answer.add_all_manager" in summary


def test_the_report_draws_the_probe_curve_beside_the_batch_mean(tmp_path):
    from memr1.engine.observe import figures
    from memr1.engine.observe.report import by_stage
    rows = [{"step": 0, "stage": "answer", "phase_start": True, "probe_reward_mean": 0.1},
            *({"step": s, "stage": "answer", "reward_mean": 0.1 * s, **({"probe_reward_mean": 0.2 * s} if s % 2 == 0
              else {})} for s in range(1, 7))]
    s = by_stage(rows, ["answer"])["answer"]
    assert [r["step"] for r in s["rows"]] == [1, 2, 3, 4, 5, 6] and s["starts"][0]["probe_reward_mean"] == 0.1
    series = figures.learning_curves("answer", s["starts"] + s["rows"], ["reward_mean"], tmp_path / "c.png")
    x, y = series["probe_reward_mean"]
    assert list(x) == [0, 2, 4, 6] and list(y) == pytest.approx([0.1, 0.4, 0.8, 1.2])
    assert (tmp_path / "c.png").stat().st_size > 0
