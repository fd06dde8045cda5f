"""bench/learning.py's runs: --data-seeds pairs with --seeds element by element, each pair one child
`memr1 train` (data.seed=D, seed=S) in its own d<D>s<S> folder, and every row and headline entry names
both seeds. The child is faked: no training runs here."""
import json
import subprocess
from pathlib import Path

import pytest

from memr1.bench import learning


def test_seeds_pair_element_by_element_and_quick_keeps_the_first_pair():
    assert learning.runs("0,1", "0,1") == [(0, 0), (1, 1)]
    assert learning.runs("0,0,3", "5,6,7") == [(5, 0), (6, 0), (7, 3)]   # (data seed, training seed)
    assert learning.runs("2,3", "4,5", quick=True) == [(4, 2)]
    for seeds, data in (("0,1", "0"), ("0", "0,1,2"), ("0,0", "1,1"), ("a", "0"), ("", "")):
        with pytest.raises(SystemExit) as e:
            learning.runs(seeds, data)
        assert "\n" not in str(e.value.code) and "--seeds" in str(e.value.code)


def test_each_run_trains_on_its_data_seed_and_names_both(tmp_path, monkeypatch):
    calls, real_run = [], subprocess.run

    def fake_run(cmd, **kw):
        if "train" not in cmd:             # git, for the commit
            return real_run(cmd, **kw)
        calls.append(cmd)
        run = Path(next(a for a in cmd if a.startswith("run_dir=")).split("=", 1)[1])
        (run / "eval").mkdir(parents=True, exist_ok=True)
        summary = {"rows": {"base.oracle_banks": {"em": 10.0}, "trained.oracle_banks": {"em": 30.0}},
                   "comparisons": {"trained.oracle_banks - base.oracle_banks": {"em": {
                       "n": 4, "delta": 20.0, "ci_low": None, "ci_high": None, "ci": "n/a (one conversation)"}}}}
        (run / "eval" / "summary.json").write_text(json.dumps(summary))
        (run / "metrics.jsonl").write_text("")
        return subprocess.CompletedProcess(cmd, 0, "stage answer: 60s, hands on x\n", "")
    monkeypatch.setattr(learning.subprocess, "run", fake_run)
    config = tmp_path / "c.toml"
    config.write_text('name = "x"\n')
    argv = ["--config", str(config), "--runs", str(tmp_path / "runs"), "--json", str(tmp_path / "o.json"),
            "--locomo", "", "--probe-items", "0", "--seeds", "3,3", "--data-seeds", "0,1"]
    learning.main(argv)
    assert [(c[c.index("--config") + 2:c.index("--config") + 5]) for c in calls] == [
        ["data.seed=0", "seed=3", f"run_dir={tmp_path / 'runs' / 'd0s3'}"],
        ["data.seed=1", "seed=3", f"run_dir={tmp_path / 'runs' / 'd1s3'}"]]
    out = json.loads((tmp_path / "o.json").read_text())
    assert {(r["data_seed"], r["seed"]) for r in out["rows"]} == {(0, 3), (1, 3)}
    assert list(out["rows"][0])[:4] == ["stage", "data_seed", "seed", "metric"]
    assert set(out["phases"]) == {"d0s3", "d1s3"}
    assert (out["settings"]["data_seeds"], out["settings"]["seeds"]) == ([0, 1], [3, 3])
    answer = {h["name"]: h for h in out["headline"]}
    for d in (0, 1):
        h = answer[f"data seed {d}, seed 3: answer em, trained answer agent - base answer agent"]
        assert (h["value"], h["ci_low"], h["ci_high"]) == (20.0, None, None)
    learning.main(argv + ["--quick"])
    assert len(calls) == 3 and "data.seed=0" in calls[-1]


def test_compute_sums_each_arms_generated_and_learner_tokens_without_probes(tmp_path):
    from memr1.bench.learning import compute_of
    rows = [{"stage": "answer", "step": 0, "phase_start": True, "probe_reward_mean": 0.1},
            {"stage": "answer_warm", "step": 1, "gen_s": 0.0, "response_tokens": 50, "positions": 300, "step_s": 6.0},
            {"stage": "answer", "step": 1, "gen_s": 2.0, "response_tokens": 640, "positions": 900, "step_s": 60.0,
             "probe_s": 12.0},
            {"stage": "answer", "step": 2, "gen_s": 2.0, "response_tokens": 600, "positions": 800, "step_s": 48.0},
            {"stage": "answer_rs", "step": 1, "gen_s": 2.0, "response_tokens": 630, "positions": 120, "step_s": 30.0},
            {"stage": "manager", "step": 1, "gen_s": 1.0, "response_tokens": 200, "frozen_tokens": 90,
             "positions": 700, "step_s": 30.0}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    got = compute_of(tmp_path)
    assert got["answer"] == {"steps": 2, "generated_tokens": 1240, "frozen_tokens": 0, "learner_positions": 1700,
                             "minutes": 1.6}
    assert got["answer_warm"]["generated_tokens"] == 0 and got["answer_warm"]["learner_positions"] == 300
    assert got["answer_rs"]["learner_positions"] == 120 and got["manager"]["frozen_tokens"] == 90


def test_the_headline_leaves_out_a_role_without_an_rl_stage():
    """configs/budget.toml trains no answer RL: its answer agent has no "RL part" to headline."""
    from memr1.bench import learning

    rows = [{"stage": "answer", "metric": "em_warm_manager_banks", "seed": 0, "data_seed": 0, "rl_delta": None},
            {"stage": "manager", "metric": "em_fixed_answerer", "seed": 0, "data_seed": 0, "rl_delta": 2.5,
             "vs_rs": 1.8, "vs_add_all": -20.4}]
    budget = ["answer_warm", "manager_warm", "manager", "manager_control", "manager_rs"]
    names = [h["name"] for h in learning.headline(rows, budget)]
    assert len(names) == 3 and all(": manager " in n for n in names)
    assert any(": answer " in h["name"] for h in learning.headline(rows))   # without stages: every entry
