"""bench/table.py and the headline contract (bench/common.py): a JSON without a headline is refused at
write time, every bench that writes a JSON builds its headline from its rows, and the README table has
one row per entry naming its rows, value, target, host, commit and the command that reproduces it."""
import ast
import json
from pathlib import Path

import pytest

from memr1.bench import table
from memr1.bench.common import headline_entry, write_json

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_write_json_refuses_a_missing_or_malformed_headline(tmp_path):
    with pytest.raises(ValueError, match="headline"):
        write_json(str(tmp_path / "a.json"), "x", [], headline=[])
    entry = headline_entry("n", 2.0, "a", "b", "b over a")
    with pytest.raises(ValueError, match="unique"):
        write_json(str(tmp_path / "a.json"), "x", [], headline=[entry, entry])
    with pytest.raises(ValueError, match="headline"):
        write_json(str(tmp_path / "a.json"), "x", [], headline=[{"name": "n", "value": 1.0}])
    assert not (tmp_path / "a.json").exists()


def test_entry_says_whether_it_meets_its_target_in_its_direction():
    assert headline_entry("r", 2.5, "a", "b", "w", target=2.0)["met"] is True
    assert headline_entry("r", 1.5, "a", "b", "w", target=2.0)["met"] is False
    assert headline_entry("t", 60.0, "a", "none", "w", unit="us", better="lower", target=50.0)["met"] is False
    assert headline_entry("t", 40.0, "a", "none", "w", unit="us", better="lower", target=50.0)["met"] is True
    assert headline_entry("r", None, "a", "b", "w", target=2.0)["met"] is None
    assert headline_entry("r", 1.0, "a", "b", "w")["met"] is None


def test_every_bench_that_writes_a_json_passes_a_headline():
    """Statically: each write_json call in bench/ passes `headline=` (its bench's test checks the value)."""
    for path in sorted(BENCH.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "write_json":
                assert "headline" in {k.arg for k in node.keywords}, f"{path.name}:{node.lineno} writes no headline"


def test_table_has_a_row_per_entry_with_its_provenance(tmp_path, capsys):
    a = tmp_path / "a.json"
    write_json(str(a), "kernels", [{"impl": "x"}], headline=[
        headline_entry("gae: over the loop", 2.5, "memr1_native 64", "loop 64", "loop's ms over memr1's", target=2.0),
        headline_entry("gae: over lfilter", None, "memr1_native 64", "lfilter 64", "lfilter's ms over memr1's")])
    b = tmp_path / "b.json"
    write_json(str(b), "learning", [], headline=[headline_entry(
        "seed 0: manager RL part", 2.5, "trained manager", "warm manager", "EM points", unit="points", target=3.0,
        ci_low=-0.5, ci_high=5.6)])
    data = json.loads(a.read_text())
    data["machine"]["argv"] = ["/x/bench/kernels.py", "--quick", "--json", "/some/runs/k.json"]
    a.write_text(json.dumps(data))
    out = tmp_path / "t.md"
    assert table.main([str(a), str(b), "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0].startswith("| bench | headline | ours / baseline | value | target |") and len(lines) == 5
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:5] == ["kernels", "gae: over the loop", "memr1_native 64 / loop 64", "2.50x", ">= 2.00x (met)"]
    assert cells[-1] == "`python -m memr1.bench.kernels --quick --json k.json`"
    commit = data["machine"]["commit"]
    assert cells[-2] == commit[:7] + ("+dirty" if commit.endswith("+dirty") else "")
    assert "| n/a |" in lines[3]
    assert "+2.5 points [-0.5, +5.6]" in lines[4] and ">= +3.0 points (missed)" in lines[4]


def test_table_refuses_a_json_without_headline_in_one_line(tmp_path, capsys):
    bad = tmp_path / "old.json"
    bad.write_text(json.dumps({"bench": "e2e", "machine": {}, "rows": []}))
    assert table.main([str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and str(bad) in err and "\n" not in err


def bench_json(path: Path, bench: str, entries: list[dict], cpu: str, commit: str, time: str, **extra) -> Path:
    """A bench JSON as write_json makes it, with the machine facts a results folder's runs differ in."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(str(path), bench, [], headline=entries, **extra)
    data = json.loads(path.read_text())
    data["machine"].update(cpu=cpu, cpus=2, commit=commit, time=time,
                           argv=[f"/x/bench/{bench}.py", "--json", f"/tmp/{path.name}"])
    path.write_text(json.dumps(data))
    return path


def pipe_cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_results_take_the_newest_folder_of_each_bench_and_recipe(tmp_path, capsys):
    """A later results folder for a bench replaces the older one; learning recipes coexist; each row
    names its own host, commit and JSON."""
    root = tmp_path / "results"
    old = [headline_entry("G=8: memr1 over trl, tokens/s", 1.5, "memr1 G=8", "trl G=8", "w", target=1.5)]
    new = [headline_entry("G=8: memr1 over trl, tokens/s", 2.5, "memr1 G=8", "trl G=8", "w", target=1.5)]
    bench_json(root / "2026-12-01-epyc" / "train_step.json", "train_step", old, "AMD EPYC", "a" * 40, "2026-12-01T10")
    bench_json(root / "2026-12-07-xeon" / "train_step.json", "train_step", new, "Intel Xeon", "b" * 40, "2026-12-07T10")
    # only the older folder ran kernels: its row stays, with its own host and commit
    bench_json(root / "2026-12-01-epyc" / "kernels.json", "kernels",
               [headline_entry("gae 64x256: over the compiled loop", 3.0, "memr1_native 64x256", "loop", "w")],
               "AMD EPYC", "a" * 40, "2026-12-01T11:00")
    point = dict(unit="points", ci_low=1.0, ci_high=9.0)
    for config, day in (("configs/default.toml", "01"), ("configs/outcome.toml", "07"), ("configs/default.toml", "03")):
        bench_json(root / f"2026-12-{day}-epyc" / f"learning_{Path(config).stem}.json", "learning", [headline_entry(
            "data seed 0, seed 0: manager em_fixed_answerer, trained manager - warm manager", float(day),
            "trained manager", "warm manager", "w", target=10.0, **point)], "AMD EPYC", day * 20,
            f"2026-12-{day}T12:00", settings={"config": config})
    # headroom on the default set and on the budgeted task: both stay (a task is its own table)
    for name, task, day in (("headroom.json", None, "01"), ("headroom_budget.json", "budget", "07")):
        bench_json(root / f"2026-12-{day}-epyc" / name, "headroom", [headline_entry(
            "d0s0: oracle banks - ADD-every-fact banks (EM, trained answer agent)", 2.0, "oracle banks",
            "ADD-every-fact banks", "w", **point)], "AMD EPYC", day * 20, f"2026-12-{day}T13:00",
                   **({"task": task} if task else {}))
    capsys.readouterr()
    assert table.main([str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    body = {pipe_cells(line)[0]: pipe_cells(line) for line in lines[2:]}
    assert lines[0].startswith("| bench | headline |") and lines[0].endswith("| command | JSON |")
    assert [b for b in body if not b.startswith("headroom")] == ["train_step", "kernels", "learning (default)",
                                                                 "learning (outcome)"]
    assert {"headroom", "headroom (budget)"} <= set(body)
    assert body["train_step"][3] == "2.50x" and body["train_step"][5] == "Intel Xeon, 2 cpus"
    assert body["train_step"][6] == "bbbbbbb" and body["train_step"][-1] == "results/2026-12-07-xeon/train_step.json"
    assert body["kernels"][5:7] == ["AMD EPYC, 2 cpus", "aaaaaaa"]
    assert body["learning (default)"][3] == "+3.0 points [+1.0, +9.0]"    # 2026-12-03, not 2026-12-01
    assert body["learning (outcome)"][3] == "+7.0 points [+1.0, +9.0]"
    assert body["train_step"][7] == "`python -m memr1.bench.train_step --json train_step.json`"


def test_readme_tables_pick_a_few_entries_and_link_their_json(tmp_path):
    root = tmp_path / "results"
    assert table.readme_tables(root.parent) == table.EMPTY   # no run folder yet (tmp_path holds none)
    entries = [headline_entry(f"G={g}: {a} over {b}, tokens/s", 1.0 + g / 10, f"{a} G={g}", f"{b} G={g}", "w",
                              target=t) for g in (4, 8, 16) for a, b, t in (("memr1_noshare", "trl_compact", 1.0),
                                                                          ("memr1", "trl", 1.5))]
    bench_json(root / "2026-12-07-xeon" / "ts.json", "train_step", entries, "Intel Xeon", "c" * 40, "2026-12-07T10:00")
    text = table.readme_tables(root)
    rows = [pipe_cells(line) for line in text.splitlines() if line.startswith("| train_step")]
    # each pair's least favourable group size, not its best
    assert [r[1] for r in rows] == ["G=4: memr1_noshare over trl_compact, tokens/s", "G=4: memr1 over trl, tokens/s"]
    assert rows[0][-2:] == ["`python -m memr1.bench.train_step --json ts.json`",
                            "[2026-12-07-xeon/ts.json](results/2026-12-07-xeon/ts.json)"]
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{table.BEGIN}\nstale\n{table.END}\nrest\n")
    assert table.main([str(root), "--readme", "--update", str(readme)]) == 0
    assert readme.read_text() == f"intro\n{table.BEGIN}\n{text}{table.END}\nrest\n"


@pytest.mark.parametrize("name, content, says", [
    ("2026-12-07-xeon/bad.json", "{not json", "not a bench JSON"),
    ("2026-12-07-xeon/list.json", "[1, 2]", "not a bench JSON"),
    ("2026-12-07-xeon/old.json", json.dumps({"bench": "e2e", "machine": {}, "rows": []}), "wrote no headline"),
    ("2026-12-07-xeon/v.json",
     json.dumps({"bench": "e2e", "machine": {}, "headline": [{"name": "n", "value": "x\ny"}]}), "not a bench JSON"),
    ("xeon-run/a.json", "{}", "named <date>-<host>"),
])
def test_results_refuse_a_bad_file_or_folder_in_one_line(tmp_path, capsys, name, content, says):
    path = tmp_path / "results" / name
    path.parent.mkdir(parents=True)
    path.write_text(content)
    assert table.main([str(tmp_path / "results"), "--readme"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and says in err
    assert str(path.parent if says.startswith("named") else path) in err
