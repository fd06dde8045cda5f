"""Hostile values from the command line, the environment and the file system are user errors: one
`error:` line and exit status 2, never a traceback (issue 35)."""
from pathlib import Path

import pytest

from memr1.engine.cli import main
from memr1.engine.config.errors import ConfigError
from memr1.engine.config.run import load_config, make_run_dir

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = str(ROOT / "configs" / "default.toml")


def one_error_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("world", ["0", "abc", "-4", "", "9" * 5000, "2.5"])
def test_a_world_size_that_is_no_rank_count_is_one_error_line(monkeypatch, capsys, world):
    monkeypatch.setenv("WORLD_SIZE", world)
    assert "WORLD_SIZE" in one_error_line(capsys, ["train", "--dry-run", "--config", DEFAULT])


@pytest.mark.parametrize("override, match", [
    ("name=a\x00b", "name must be a folder name"), ("name=' '", "name must be a folder name"),
    ('name="a\\nb"', "name must be a folder name"), ("run_dir=runs/a\x00b", "run_dir holds a NUL byte"),
    ("cache_dir=c\x00", "cache_dir holds a NUL byte"), ("seed=" + "9" * 5000, "Exceeds the limit"),
])
def test_hostile_config_values_are_one_error_line(capsys, override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, [override])
    assert match in one_error_line(capsys, ["train", "--dry-run", "--config", DEFAULT, override])


def test_an_integer_of_5000_digits_in_a_config_file_is_not_valid_toml(tmp_path):
    f = tmp_path / "big.toml"
    f.write_text("seed = " + "9" * 5000 + "\n")
    with pytest.raises(ConfigError, match=r"big\.toml: not valid TOML \(Exceeds the limit"):
        load_config(f)


def test_a_config_that_is_no_regular_file_is_named_so(capsys):
    assert "/dev/zero is not a regular file" in one_error_line(capsys, ["train", "--config", "/dev/zero"])


@pytest.mark.parametrize("where", ["file/run", "/proc/memr1-run", "/proc/self"])
def test_a_run_dir_that_cannot_hold_files_is_a_config_error(tmp_path, where):
    (tmp_path / "file").write_text("x")
    path = tmp_path / where if where.startswith("file") else Path(where)
    with pytest.raises(ConfigError, match="cannot write there"):
        make_run_dir(path)
    assert make_run_dir(tmp_path / "a" / "b").is_dir()


def test_resume_drops_metrics_lines_that_are_not_utf8_or_too_deep(tmp_path):
    import json
    from memr1.engine.observe.runlog import truncate_metrics
    good = [json.dumps({"stage": "manager", "step": s, "loss": 0.5}).encode() for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_bytes(b"\n".join([good[0], b"\xff\xfe{\"step\": 2}", good[1],
                                                         b"[" * 100_000, good[2], b'{"stage": "manager", "st']))
    assert truncate_metrics(tmp_path, {"manager": 2}) == 4
    assert (tmp_path / "metrics.jsonl").read_bytes() == good[0] + b"\n" + good[1] + b"\n"
