"""bench.e2e: the leg order, TRL's micro-batch size, the reward TRL is given (memr1's answer reward), and a
--quick run on the tiny model (every trainer's row, matched settings, the JSON's provenance)."""
import importlib.util
import json
import math
import subprocess
import sys
from types import SimpleNamespace

import pytest

from memr1.bench.e2e import TRAINERS, headline, leg_order
from memr1.bench.e2e_trl import Counts, micro_size
from memr1.rl.task.agents.answer import AnswerConfig
from memr1.rl.task.rewards import RewardConfig
from memr1.rl.task.turns import Task


def test_legs_mirror_and_micro_batches_fit_the_budget():
    assert leg_order(2) == [*TRAINERS, *TRAINERS[::-1]]
    assert micro_size(64, 400, 8192) == 16   # 20 rows would fit, 16 is the largest divisor of 64 that does
    assert micro_size(16, 500, 8192) == 16
    assert micro_size(8, 9000, 8192) == 1    # a row over the budget still trains, one at a time


def test_trl_reward_is_memr1s_answer_reward_and_counts_tokens():
    stage = SimpleNamespace(ctx=SimpleNamespace(task=Task(answer=AnswerConfig()),
                                                reward=RewardConfig(answer_format_penalty=0.5)),
                            cfg=SimpleNamespace(group_size=2))
    counts = Counts(stage)
    texts = ["Answer: Paris.", "paris", "Answer: Rome", "Answer: Rome"]
    rewards = counts([[{"role": "assistant", "content": t}] for t in texts], [[1] * 3, [1] * 5, [1] * 2, [1] * 2],
                     ["Paris", "Paris", "Oslo", "Oslo"], ["q"] * 4)
    assert rewards == [1.0, 0.5, 0.0, 0.0]   # EM 1; EM 1 without the "Answer:" line; two misses
    assert counts.tokens == [12] and counts.signal == [8 / 12]   # the second group's rewards are equal


def test_refill_is_compared_with_skip_only_per_informative_group_and_never_with_trl():
    def row(trainer, wall, groups, tokens):
        return {"model": "m", "trainer": trainer, "wall_per_step_s": wall, "step_s": wall, "gen_s": 1.0,
                "train_s": 1.0, "sync_s": 0.0, "positions": 10, "padded_frac": 0.0, "signal_frac": 0.5,
                "informative_groups": groups, "wall_per_informative_group_s": wall / groups,
                "tokens_per_informative_group": tokens / groups}
    rows = [row("memr1_staleness0", 2.0, 2, 100), row("memr1_refill", 3.0, 4, 200), row("trl", 4.0, 2, 100)]
    head = {h["name"]: h for h in headline(rows)}
    refill = head["m: refill over skip-only, wall per informative group"]
    assert refill["value"] == pytest.approx((2.0 / 2) / (3.0 / 4))
    assert refill["informative_groups"] == {"skip": 2, "refill": 4}
    assert "m: memr1_staleness0 over trl, steps/s" in head and not any("memr1_refill over" in n for n in head)


def test_init_must_be_a_model_folder(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "memr1.bench.e2e", "--rows", "smollm2", "--init", str(tmp_path),
                           "--json", str(tmp_path / "e2e.json")], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and not (tmp_path / "e2e.json").exists()
    assert proc.stderr.strip().splitlines()[-1] == (
        f"--init {tmp_path}: not a model folder (missing config.json, model.safetensors, tokenizer.json)")


@pytest.mark.slow
def test_quick_run_rows_and_provenance(tmp_path):
    # find_spec, not importorskip: importing trl sets VLLM_LOGGING_LEVEL=ERROR in this process's
    # environment, which would leak into every later test's subprocesses.
    if importlib.util.find_spec("trl") is None:
        pytest.skip("trl is not installed (the Makefile installs it)")
    out = tmp_path / "e2e.json"
    proc = subprocess.run([sys.executable, "-m", "memr1.bench.e2e", "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_quick_json(json.loads(out.read_text()))


def check_quick_json(data: dict) -> None:
    rows = {r["trainer"]: r for r in data["rows"]}
    vllm = importlib.util.find_spec("vllm") is not None
    assert set(rows) == set(TRAINERS) - (set() if vllm else {"trl_vllm", "trl_vllm_no_is"}) and len(data["rows"]) == len(rows)
    keys = {"model", "trainer", "group_size", "tokens_per_s", "steps_per_s", "step_s", "step_s_spread", "steps_timed",
            "response_tokens", "signal_frac", "generation", "settings"}
    for r in rows.values():
        assert keys <= set(r), keys - set(r)
        assert r["model"] == "tiny-random" and r["group_size"] == 4 and r["steps_timed"] == 3
        assert math.isfinite(r["steps_per_s"]) and r["steps_per_s"] > 0, r
        assert math.isfinite(r["tokens_per_s"]) and r["tokens_per_s"] > 0, r
        lo, hi = r["step_s_spread"]
        assert 0 < lo <= r["step_s"] <= hi and r["steps_per_s"] == pytest.approx(1 / r["step_s"])
    trl, ours = rows["trl"]["settings"], rows["memr1_staleness0"]["settings"]
    assert trl["num_generations"] == 4 and trl["beta"] == 0 and trl["loss_type"] == "dapo"
    assert trl["per_device_train_batch_size"] * trl["gradient_accumulation_steps"] == 4 * ours["prompts_per_step"]
    assert trl["learning_rate"] == ours["lr"] and trl["max_completion_length"] == ours["max_new_tokens"]
    assert ours["learner"]["train_layers"] == 0 and not ours["learner"]["activation_checkpointing"]
    assert rows["trl"]["generation"] == "hf" and data["settings"]["checks"]["tiny"]["prompts_checked"] > 0
    # the noskip row computes every group; the others compute exactly the groups with signal
    assert rows["memr1_noskip"]["computed_frac"] == 1.0 and not rows["memr1_noskip"]["settings"]["skip_zero_advantage"]
    assert rows["memr1_staleness0"]["computed_frac"] == rows["memr1_staleness0"]["signal_frac"]
    # refill draws up to prompts_per_step extra prompts a step; every memr1 row counts its informative groups
    assert rows["memr1_refill"]["settings"]["refill_max_prompts"] == ours["prompts_per_step"]
    assert rows["memr1_staleness0"]["settings"]["refill_max_prompts"] == 0
    assert all(0 <= rows[t]["informative_groups"] <= ours["prompts_per_step"] for t in rows if t.startswith("memr1"))
    for t in ("trl", "trl_vllm", "trl_vllm_no_is") if vllm else ("trl",):   # TRL's step split and its positions
        r = rows[t]
        assert r["gen_s"] > 0 and r["train_s"] > 0 and r["gen_s"] + r["train_s"] <= r["step_s_spread"][1] * 1.001
        assert r["positions"] > 0 and 0 <= r["padded_frac"] < 1
    head = {h["name"]: h for h in data["headline"]}
    noskip = head["tiny-random: memr1_noskip over trl, steps/s"]
    assert noskip["value"] == pytest.approx(rows["trl"]["wall_per_step_s"] / rows["memr1_noskip"]["wall_per_step_s"])
    for r in rows.values():
        assert r["wall_per_step_s"] > 0
        if r["trainer"].startswith("trl"):  # contiguous steps: one leg's wall per step is their mean
            assert r["wall_per_step_s"] == pytest.approx(sum(r["step_s_all"]) / len(r["step_s_all"]))
    assert noskip["ours_gen_s"] == rows["memr1_noskip"]["gen_s"] and noskip["theirs_train_s"] == rows["trl"]["train_s"]
    assert noskip["target"] is None  # the 2x target is against TRL with vLLM, not HF generate
    if vllm:
        r = rows["trl_vllm"]
        assert r["generation"] == "vllm" and r["settings"]["use_vllm"] and r["sync_s"] > 0  # reload_sync ran
        assert head["tiny-random: memr1_noskip over trl_vllm, steps/s"]["target"] == 2.0
        no_is = rows["trl_vllm_no_is"]["settings"]
        assert no_is["use_vllm"] and no_is["vllm_importance_sampling_correction"] is False
        assert r["settings"]["vllm_importance_sampling_correction"] is True   # TRL's default, on the other row
        assert head["tiny-random: memr1_noskip over trl_vllm_no_is, steps/s"]["target"] is None
    assert head["tiny-random: skipping equal-reward groups, steps/s"]["value"] == pytest.approx(
        rows["memr1_noskip"]["wall_per_step_s"] / rows["memr1_staleness0"]["wall_per_step_s"])
    m = data["machine"]
    assert m["commit"] and m["time"] and m["argv"] and m["torch"] and m["trl"]
