"""engine.config: TOML loading, dotted overrides, clear errors, and the TOML writer's round trip."""
import tomllib
from pathlib import Path

import msgspec
import pytest

from memr1.engine.config import ConfigError, RunConfig, dump_toml, load_config

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_configs_load():
    default = load_config(ROOT / "configs" / "default.toml")
    assert default.generator.model == "default" and default.eval.judge == "off"
    assert default.eval_after == ["base", "trained"] and default.items.answer_banks == "manager"
    assert default.resolved_run_dir() == Path("runs/default")
    smoke = load_config(ROOT / "configs" / "eval_smoke.toml")
    assert smoke.data.n == 2 and smoke.generator.backend == "vllm" and smoke.eval.max_questions == 2


def test_defaults_without_a_file():
    cfg = load_config(None)
    assert cfg == RunConfig() and cfg.data.path is None


def test_overrides_parse_toml_literals_and_fall_back_to_strings(tmp_path):
    cfg = load_config(None, ["eval.baseline=rag", "eval.batch_size=8", "eval.progress=false",
                             "sampling.stop=['</s>', 'x']", "generator.max_model_len = 1024",
                             "data.path=/data/locomo.json", "name=my run", "sampling.temperature=0.5"])
    assert cfg.eval.baseline == "rag" and cfg.eval.batch_size == 8 and cfg.eval.progress is False
    assert cfg.sampling.stop == ["</s>", "x"] and cfg.generator.max_model_len == 1024
    assert cfg.data.path == "/data/locomo.json" and cfg.name == "my run"
    assert cfg.sampling.temperature == 0.5
    assert cfg.resolved_run_dir() == Path("runs/my run")
    # an override wins over the file
    f = tmp_path / "c.toml"
    f.write_text('[eval]\nbaseline = "base"\n')
    assert load_config(f, ["eval.baseline=full_context"]).eval.baseline == "full_context"


@pytest.mark.parametrize("text, match", [
    ('[eval]\nbaselin = "rag"\n', "unknown key 'eval.baselin'"),
    ('[generator]\nbackend_x = 1\n', "unknown key 'generator.backend_x'"),
    ('[nonsense]\na = 1\n', "unknown key 'nonsense'"),
    ('eval = 3\n', "'eval' is a section"),
    ('[eval]\nbatch_size = "many"\n', r"\$\.eval\.batch_size"),
    ('[eval]\nbaseline = "nope"\n', "eval.baseline must be one of"),
    ('[eval]\nbatch_size = 0\n', "eval.batch_size must be >= 1"),
    ('embedder = "word2vec"\n', "embedder must be one of"),
    ('[eval\n', "not valid TOML"),
])
def test_bad_files_name_the_problem(tmp_path, text, match):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=match) as e:
        load_config(f)
    assert "bad.toml" in str(e.value)


@pytest.mark.parametrize("item, match", [
    ("eval.baseline", "must look like key=value"),
    ("eval..x=1", "not a dotted key"),
    ("eval.nope=1", "unknown key 'eval.nope'"),
    ("name.sub=1", "is a value, not a section"),
    ("eval.batch_size=abc", r"\$\.eval\.batch_size"),
])
def test_bad_overrides_name_the_problem(item, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, [item])


def test_missing_file():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent/run.toml")


def test_dump_toml_round_trips(tmp_path):
    cfg = load_config(ROOT / "configs" / "default.toml",
                      ['name="tricky \\"quoted\\" name ü"', "sampling.stop=['a\\nb', 'tab\\t']",
                       "eval.fact_match_f1=0.75", "sampling.seed=7"])
    text = dump_toml(cfg)
    assert "path" not in tomllib.loads(text)["data"]   # None is left out (TOML has no null)
    back = msgspec.convert(tomllib.loads(text), RunConfig)
    assert back == cfg
    f = tmp_path / "config.toml"
    f.write_text(text)
    assert load_config(f) == cfg
