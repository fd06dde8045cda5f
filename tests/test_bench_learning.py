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
