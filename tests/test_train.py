"""`memr1 train` end to end on a tiny random model: run directory, stage order and hand-over, resume,
stage-2 banks, the end-of-run evaluation, validation with best-checkpoint selection, the dry run."""
import json
import subprocess
from pathlib import Path

import pytest

from memr1.engine.checkpoints.io import final_checkpoint, latest_checkpoint
from memr1.engine.config.plan import plan_text
from memr1.engine.config.resolve import budget_warnings
from memr1.engine.config.run import load_config
from memr1.engine.train import train
from memr1.rl.task.data.locomo import DataError
from run_helpers import overrides, rows


@pytest.mark.slow
def test_both_stages_write_the_run_directory_and_resume(tiny_model, tmp_path):
    """The paper's order and pipelines: stage-1 items on banks the base manager built from each call's
    history, stage 2 on banks the trained manager built."""
    run = tmp_path / "run"
    out = train(load_config(None, overrides(tiny_model, run, 2)))
    assert (run / "config.toml").is_file() and any((run / "tb").rglob("events.*"))
    got = rows(run)
    assert [(r["stage"], r["step"]) for r in got] == [("manager", 1), ("manager", 2), ("answer", 1), ("answer", 2)]
    for key in ("reward_mean", "reward_em", "reward_format", "em_mean", "f1_mean", "loss", "kl", "nll", "gen_s",
                "train_s", "sync_s", "tokens_per_s", "weight_version", "staleness", "capped_rate", "positions"):
        assert all(key in r for r in got), key
    assert all("frozen_capped_rate" in r and "ops_add" in r for r in got if r["stage"] == "manager")
    assert set(out["checkpoints"]) == {"manager", "answer"} and out["stopped"] is None
    assert list((run / "manager" / "items").glob("*/*/bank/MANIFEST.json"))   # the history banks
    assert list((run / "answer" / "banks").glob("*/*/bank/MANIFEST.json"))    # stage-2 banks
    ckpt = latest_checkpoint(run / "manager")
    assert ckpt.name == "step_2" and json.loads((ckpt / "state.json").read_text())["step"] == 2
    assert (ckpt / "tokenizer.json").is_file() and (ckpt / "chat_template.jinja").is_file()

    # Resume with more steps: each stage continues from its checkpoint, no step is redone.
    more = load_config(run / "config.toml", ["stage.manager.steps=3", "stage.answer.steps=3"])
    train(more)
    assert [(r["stage"], r["step"]) for r in rows(run)][4:] == [("manager", 3), ("answer", 3)]


@pytest.mark.slow
def test_warm_then_rl_hand_over_controls_and_the_final_evaluation(tiny_model, tmp_path, monkeypatch):
    """answer_warm -> answer -> answer_control -> manager_warm -> manager -> manager_control: each RL
    stage starts from its role's newest checkpoint, a control from its warm start on exactly the RL
    stage's prompts, step by step, and hands on nothing (the manager's frozen answerer is the RL answer
    agent); the end of the run evaluates base, warm, trained and control with paired comparisons."""
    from memr1.engine import stage_driver, train as train_mod
    sources: dict[str, list] = {}

    class Recording(stage_driver.Learner):
        def train_step(self, batch):
            sources.setdefault(self.recording, []).append([g.source for g in batch.groups])
            return super().train_step(batch)

    real_stage = train_mod.train_stage

    def stage_named(run, name, *a, **k):
        Recording.recording = name
        return real_stage(run, name, *a, **k)
    monkeypatch.setattr(stage_driver, "Learner", Recording)
    monkeypatch.setattr(train_mod, "train_stage", stage_named)
    run = tmp_path / "run"
    stages = ("answer_warm", "answer", "answer_control", "manager_warm", "manager", "manager_control")
    cfg = load_config(None, overrides(tiny_model, run, 1, stages) + [
        'eval_after=["base", "warm", "trained", "control"]', "eval_split=train", f"cache_dir={tmp_path / 'cache'}",
        "eval.max_turns=6", "eval.max_questions=1", "items.bank_pipeline=oracle", "items.answer_banks=oracle",
        "eval.resamples=200", "stage.manager.steps=2", "stage.answer_warm.lr=3e-4"])
    out = train(cfg)
    got = rows(run)
    assert [(r["stage"], r["step"]) for r in got] == [
        ("answer_warm", 1), ("answer", 1), ("answer_control", 1), ("manager_warm", 1), ("manager", 1), ("manager", 2),
        ("manager_control", 1), ("manager_control", 2)]
    assert sources["manager_control"] == sources["manager"] and sources["answer_control"] == sources["answer"]
    assert all(r["dead_items"] == 0 for r in got if r["stage"] == "manager")
    control = json.loads((latest_checkpoint(run / "manager_control") / "state.json").read_text())
    assert control["step"] == 2
    frozen = json.loads((run / "eval" / "train.trained.json").read_text())["models"]["answer"]
    assert "answer/checkpoints" in frozen and "control" not in frozen   # controls hand on nothing
    evals = {k: Path(v).name for k, v in out["evals"].items()}
    assert evals["base"] == "train.base.json" and evals["trained"] == "train.trained.json"
    assert evals["warm.oracle_banks"] == "train.warm.oracle_banks.json"
    for label in ("base", "warm", "control"):
        assert evals[f"trained_answer.{label}_manager"] == f"train.trained_answer.{label}_manager.json"
    ctrl = json.loads((run / "eval" / "train.control.json").read_text())
    assert "manager_control/checkpoints" in ctrl["models"]["manager"]
    assert "answer_control/checkpoints" in ctrl["models"]["answer"]
    base, trained = (json.loads((run / "eval" / f"train.{w}.json").read_text()) for w in ("base", "trained"))
    assert "manager/checkpoints/step_2" in trained["models"]["manager"]
    assert base["models"]["extract"] == trained["models"]["extract"] and base["n_questions"] == trained["n_questions"]
    summary = json.loads((run / "eval" / "summary.json").read_text())
    assert {"base", "warm", "trained", "control", "base.oracle_banks"} <= set(summary["rows"])
    for name in ("trained - base", "trained.oracle_banks - warm.oracle_banks", "trained - control",
                 "trained - trained_answer.base_manager", "trained - trained_answer.warm_manager",
                 "trained - trained_answer.control_manager"):
        r = summary["comparisons"][name]["em"]
        assert r["n"] > 0 and r["clusters"] <= r["n"] and r["ci_low"] <= r["delta"] <= r["ci_high"]

    # bench.learning reads its rows from this run: every stage and metric, each comparison as summarised.
    from memr1.bench.learning import rows_of
    table = {(r["stage"], r["metric"]): r for r in rows_of(run, 0, 1.0)}
    assert set(table) == {("answer", "em"), ("answer", "f1"), ("answer", "em_warm_manager_banks"),
                          ("answer", "f1_warm_manager_banks"), ("manager", "em_fixed_answerer"),
                          ("manager", "f1_fixed_answerer"), ("manager", "op_accuracy"), ("manager", "op_accuracy_seen"),
                          ("manager", "op_accuracy_unseen"), ("manager", "op_accuracy_ids"), ("manager", "parse_failure"),
                          ("manager", "parse_failure_last3"), ("end_to_end", "em"), ("end_to_end", "f1")}
    e2e = table[("end_to_end", "em")]
    assert e2e["delta"] == summary["comparisons"]["trained - base"]["em"]["delta"]
    assert e2e["vs_control"] == summary["comparisons"]["trained - control"]["em"]["delta"]
    assert e2e["base"] == summary["rows"]["base"]["em"] and e2e["control"] == summary["rows"]["control"]["em"]
    assert table[("answer", "f1")]["rl_delta"] == summary["comparisons"]["trained.oracle_banks - warm.oracle_banks"]["f1"]["delta"]
    fixed = table[("manager", "em_fixed_answerer")]
    assert fixed["warm"] == summary["rows"]["trained_answer.warm_manager"]["em"]
    assert fixed["rl_delta"] == summary["comparisons"]["trained - trained_answer.warm_manager"]["em"]["delta"]
    assert fixed["split"] == "test" and fixed["cluster"] == "conversation"
    from memr1.bench.learning import headline
    head = {h["name"]: h for h in headline(list(table.values()))}
    rl = head["data seed 0, seed 0: manager em_fixed_answerer, trained manager - warm manager"]
    assert (rl["value"], rl["ci_low"], rl["ci_high"]) == (fixed["rl_delta"], fixed["rl_ci_low"], fixed["rl_ci_high"])
    answer = table[("answer", "em")]
    assert head["data seed 0, seed 0: answer em, trained answer agent - base answer agent"]["value"] == answer["delta"]
    control = head["data seed 0, seed 0: answer em, trained answer agent - control answer agent"]
    assert control["value"] == answer["vs_control"] and control["ci_high"] == answer["vs_control_ci_high"]
    assert len(head) == 7   # no LoCoMo rows


@pytest.mark.slow
def test_validation_hands_on_the_best_checkpoint_and_never_trains_on_val(tiny_model, tmp_path, monkeypatch):
    from memr1.engine import stage_driver
    from memr1.rl.task.data import load_conversations
    trained_on = []

    class Recording(stage_driver.Learner):
        def train_step(self, batch):
            trained_on.extend(g.source.split()[0] for g in batch.groups)
            return super().train_step(batch)
    monkeypatch.setattr(stage_driver, "Learner", Recording)
    run = tmp_path / "run"
    cfg = load_config(None, overrides(tiny_model, run, 3, ("answer_warm", "answer")) + [
        "loop.validate_every=1", "items.answer_banks=oracle", "data.n=20"])
    train(cfg)
    train_ids = {c.sample_id for c in load_conversations(None, n=20, split="train")}
    val_ids = {c.sample_id for c in load_conversations(None, n=20, split="val")}
    assert trained_on and set(trained_on) <= train_ids and not set(trained_on) & val_ids
    val = [r for r in rows(run) if "val_reward_em" in r]
    assert len(val) == 3 and all("val_em_mean" in r and "val_s" in r for r in val)
    best = json.loads((run / "answer" / "best.json").read_text())
    assert best["metric"] == "reward_em" and best["score"] == max(r["val_reward_em"] for r in val)
    first_best = min(r["step"] for r in val if r["val_reward_em"] == best["score"])
    assert best["step"] == first_best and final_checkpoint(run / "answer").name == f"step_{first_best}"


@pytest.mark.slow
def test_only_the_stages_named_in_validate_stages_validate(tiny_model, tmp_path):
    run = tmp_path / "run"
    with pytest.raises(DataError, match=r"^loop.validate_every=1: manager, answer would validate on the val split, and the "
                                        r"synthetic set at data.n=3 has no val conversation"):
        train(load_config(None, overrides(tiny_model, run, 1) + ["loop.validate_every=1"]))
    train(load_config(None, overrides(tiny_model, run, 1) + ["loop.validate_every=1", 'loop.validate_stages=["answer"]',
                                                             "data.n=20"]))
    validated = {r["stage"] for r in rows(run) if "val_reward_em" in r}
    assert validated == {"answer"} and {r["stage"] for r in rows(run)} == {"manager", "answer"}
    assert (run / "answer" / "best.json").is_file() and not (run / "manager" / "best.json").exists()


def test_dry_run_plans_anywhere_and_catches_what_cannot_fit(tiny_model, tmp_path):
    text, fits = plan_text(load_config(None, overrides(tiny_model, tmp_path, 1)))
    assert fits and "2 prompts x 2 = 4 completions/step" in text and "GiB" in text
    gpu = load_config(None, overrides(tiny_model, tmp_path, 1) + ["learner.device=cuda"])
    text, fits = plan_text(gpu)
    import torch
    if not torch.cuda.is_available():
        assert fits and "not checked (planned for CUDA" in text   # planning a GPU run from here works
        text, fits = plan_text(gpu, dry_run=False)
        assert not fits and "no CUDA device" in text             # running it here does not
    huge = ["generator.max_model_len=1048576", "learner.micro_batch_tokens=16777216"]  # the largest allowed
    text, fits = plan_text(load_config(None, overrides(tiny_model, tmp_path, 1) + huge))
    assert not fits and "DOES NOT FIT" in text


@pytest.mark.parametrize("name", ["default", "outcome", "locomo_grpo", "locomo_ppo"])
def test_shipped_configs_plan_and_their_budgets_cannot_cut_a_reply(name, monkeypatch):
    """Each shipped recipe plans on this machine (even the GPU ones), and its answer budget holds a
    well-formed reply; the LoCoMo recipes are the paper's (128 prompts, EM, temperature 1.0)."""
    from transformers import AutoTokenizer
    from memr1.engine.generation import default_model_path
    from memr1.rl.task.agents.answer import longest_reply_to_fit
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = load_config(f"configs/{name}.toml")
    assert budget_warnings(cfg) == []
    tok = AutoTokenizer.from_pretrained(default_model_path())
    assert len(tok.encode(longest_reply_to_fit(cfg.answer), add_special_tokens=False)) < cfg.answer.max_new_tokens
    text, fits = plan_text(cfg)
    assert fits, text
    if name.startswith("locomo"):
        algo = name[7:]
        assert cfg.reward.kind == "em" and cfg.rollout.temperature == 1.0 and cfg.learner.algo == algo
        assert all(cfg.stage.manager.lr == s.lr == 1e-6 for s in (cfg.stage.manager, cfg.stage.answer))
        group = 8 if algo == "grpo" else 1
        assert f"128 prompts x {group} = {128 * group} completions/step" in text
        assert cfg.answer.max_new_tokens == cfg.manager.max_new_tokens == 2048
        assert cfg.items.bank_pipeline == "manager" and cfg.loop.validate_every > 0


def test_bench_learning_headline_takes_each_entry_from_its_row():
    from memr1.bench.learning import headline
    rows = [{"stage": "manager", "seed": 1, "metric": "em_fixed_answerer", "rl_delta": 4.0, "rl_ci_low": 1.0,
             "rl_ci_high": 7.0, "delta": 9.0},
            {"stage": "answer", "seed": 1, "metric": "em", "delta": 12.0, "ci_low": 8.0, "ci_high": 16.0,
             "vs_control": None},
            {"stage": "locomo_val", "seed": 1, "metric": "f1", "delta": 6.0, "base": 20.0, "trained": 26.0},
            {"stage": "locomo_val", "seed": 1, "metric": "memories_per_10_turns", "base": 3.0, "trained": 0.5},
            {"stage": "end_to_end", "seed": 1, "metric": "em", "delta": 1.0}]
    rl, vs_rs, vs_add_all, answer, control, f1, memories = headline(rows)
    assert (rl["value"], rl["ci_low"], rl["ci_high"], rl["met"]) == (4.0, 1.0, 7.0, False)   # target +10
    assert vs_rs["value"] is None and vs_add_all["baseline"] == "ADD-every-fact banks"
    assert (rl["ours"], rl["baseline"], rl["unit"]) == ("trained manager", "warm manager", "points")
    assert (answer["value"], answer["ci_low"], answer["target"], answer["met"]) == (12.0, 8.0, 15.0, False)
    assert control["value"] is None and control["target"] is None and control["met"] is None
    assert f1["value"] == 6.0 and f1["target"] == 5.0 and f1["met"]
    assert (memories["value"], memories["unit"], memories["baseline"], memories["met"]) == (0.5, "count", "none", False)


def test_bench_learning_reuses_a_seed_only_for_the_same_command_and_config(tmp_path, monkeypatch):
    """--reuse reads a finished seed instead of rerunning it, unless the config's text changed."""
    from memr1.bench import learning
    calls, real_run = [], subprocess.run

    def fake_run(cmd, **kw):
        if "train" not in cmd:             # git, for the commit
            return real_run(cmd, **kw)
        calls.append(cmd)
        run = Path(next(a for a in cmd if a.startswith("run_dir=")).split("=", 1)[1])
        (run / "eval").mkdir(parents=True, exist_ok=True)
        (run / "eval" / "summary.json").write_text(json.dumps({"rows": {}, "comparisons": {}}))
        (run / "metrics.jsonl").write_text("")
        return subprocess.CompletedProcess(cmd, 0, "stage answer: 60s, hands on x\n", "")
    monkeypatch.setattr(learning.subprocess, "run", fake_run)
    config = tmp_path / "c.toml"
    config.write_text('name = "x"\n')
    argv = ["--quick", "--config", str(config), "--runs", str(tmp_path / "runs"), "--json", str(tmp_path / "o.json"),
            "--locomo", "", "--probe-items", "0"]
    learning.main(argv + ["--reuse"])
    learning.main(argv + ["--reuse"])
    assert len(calls) == 1
    learning.main(argv)                       # without --reuse every seed runs
    config.write_text('name = "y"\n')
    learning.main(argv + ["--reuse"])         # a changed config is rerun
    assert len(calls) == 3
    out = json.loads((tmp_path / "o.json").read_text())
    assert out["phases"]["d0s0"] == {"stage answer": 1.0} and {r["stage"] for r in out["rows"]} == {
        "answer", "manager", "end_to_end"}
    assert '--locomo' not in str(calls[0]) and "eval_split=test" in calls[0]
    # an empty summary: the rows exist with no values, and so does each of their headline entries
    assert {h["name"] for h in out["headline"]} == {f"data seed 0, seed 0: {n}" for n in (
        "manager em_fixed_answerer, trained manager - warm manager",
        "manager em_fixed_answerer, trained manager - rejection-sampling manager",
        "manager em_fixed_answerer, trained manager - ADD-every-fact banks",
        "answer em, trained answer agent - base answer agent",
        "answer em, trained answer agent - control answer agent",
        "answer em_warm_manager_banks, trained answer agent - warm answer agent",
        "answer em_warm_manager_banks, trained answer agent - rejection-sampling answer agent")}
    assert all(h["value"] is None for h in out["headline"])
    assert {("manager", "em_fixed_answerer"), ("answer", "em")} <= {(r["stage"], r["metric"]) for r in out["rows"]}
