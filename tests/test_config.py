"""engine.config: TOML loading, dotted overrides, clear errors, and the TOML writer's round trip."""
import tomllib
from pathlib import Path

import msgspec
import pytest

from memr1.engine.config import ConfigError, RunConfig, dump_toml, load_config

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_configs_load():
    default = load_config(ROOT / "configs" / "default.toml")
    assert default.generator.model == "default" and default.judge.kind == "off"
    assert default.eval_after == ["base", "warm", "trained"] and default.items.answer_banks == "oracle"
    assert default.resolved_run_dir() == Path("runs/default")
    smoke = load_config(ROOT / "configs" / "eval_smoke.toml")
    assert smoke.data.n == 2 and smoke.generator.backend == "vllm" and smoke.eval.max_questions == 2


def test_defaults_without_a_file():
    cfg = load_config(None)
    assert cfg == RunConfig() and cfg.data.path is None


def test_overrides_parse_toml_literals_and_fall_back_to_strings(tmp_path):
    cfg = load_config(None, ["eval.baseline=rag", "generator.batch_size=8", "eval.progress=false",
                             "stages=['answer', 'manager']", "generator.max_model_len = 1024",
                             "data.path=/data/locomo.json", "name=my run", "rollout.temperature=0.5"])
    assert cfg.eval.baseline == "rag" and cfg.generator.batch_size == 8 and cfg.eval.progress is False
    assert cfg.stages == ["answer", "manager"] and cfg.generator.max_model_len == 1024
    assert cfg.data.path == "/data/locomo.json" and cfg.name == "my run"
    assert cfg.rollout.temperature == 0.5
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
    ('[generator]\nbatch_size = "many"\n', r"\$\.generator\.batch_size"),
    ('[eval]\nbaseline = "nope"\n', "eval.baseline must be one of"),
    ('[manager]\ntop_k = 0\n', "manager.top_k must be >= 1"),
    ('[stage.answer]\nsteps = 0\n', "steps must be >= 1"),
    ('[reward]\nkind = "bleu"\n', r"\$\.reward\.kind"),
    ('stages = ["answer", "critic"]\n', "unknown stage"),
    ('stages = ["answer_warm"]\n[stage.answer_warm]\ngroup_size = 4\n', "group_size must be 1"),
    ('[reward]\nkind = "judge"\n', "needs judge.kind"),
    ('name = ".."\n', "name must be a folder name"),
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
    ("generator.batch_size=abc", r"\$\.generator\.batch_size"),
    ("seed=x", r"\$\.seed"),
])
def test_bad_overrides_name_the_problem(item, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, [item])


def test_missing_file():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent/run.toml")


def test_dump_toml_round_trips(tmp_path):
    cfg = load_config(ROOT / "configs" / "default.toml",
                      ['name="tricky \\"quoted\\" name ü"', "stages=['answer']",
                       "eval.fact_match_f1=0.75", "seed=7", "learner.betas=[0.8, 0.9]"])
    text = dump_toml(cfg)
    assert "path" not in tomllib.loads(text)["data"]   # None is left out (TOML has no null)
    back = msgspec.convert(tomllib.loads(text), RunConfig)
    assert back == cfg
    f = tmp_path / "config.toml"
    f.write_text(text)
    assert load_config(f) == cfg
