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
    assert cells[-2] == data["machine"]["commit"][:7] + ("+dirty" if data["machine"]["commit"].endswith("+dirty") else "")
    assert "| n/a |" in lines[3]
    assert "+2.5 points [-0.5, +5.6]" in lines[4] and ">= +3.0 points (missed)" in lines[4]


def test_table_refuses_a_json_without_headline_in_one_line(tmp_path, capsys):
    bad = tmp_path / "old.json"
    bad.write_text(json.dumps({"bench": "e2e", "machine": {}, "rows": []}))
    assert table.main([str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and str(bad) in err and "\n" not in err
