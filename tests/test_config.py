"""engine.config.run: TOML loading, dotted overrides, clear errors, and the TOML writer's round trip."""
import subprocess
import sys
import tomllib
from pathlib import Path

import msgspec
import pytest

from memr1.engine.config.errors import ConfigError
from memr1.engine.config.run import RunConfig, load_config
from memr1.engine.config.toml_out import dump_toml

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_configs_load():
    default = load_config(ROOT / "configs" / "default.toml")
    assert default.generator.model == "default" and default.judge.kind == "off"
    assert default.eval_after == ["base", "warm", "trained"] and default.items.answer_banks == "oracle"
    assert default.resolved_run_dir() == Path("runs/default")
    smoke = load_config(ROOT / "configs" / "eval_smoke.toml")
    assert smoke.data.n == 2 and smoke.generator.backend == "vllm" and smoke.eval.max_questions == 2


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    assert isinstance(load_config(path), RunConfig)


def unbounded_numbers(t, path: str = "") -> list[str]:
    """Numeric fields (list and tuple items too) of a msgspec type without a lower or an upper bound."""
    import msgspec.inspect as mi
    while isinstance(t, mi.UnionType):
        t = next((u for u in t.types if not isinstance(u, mi.NoneType)), None)
    if isinstance(t, (mi.IntType, mi.FloatType)):
        low, high = (t.ge, t.gt) != (None, None), (t.le, t.lt) != (None, None)
        return [] if low and high else [path]
    if isinstance(t, mi.StructType):
        return [p for f in t.fields for p in unbounded_numbers(f.type, f"{path}.{f.name}".lstrip("."))]
    if isinstance(t, (mi.ListType, mi.VarTupleType)):
        return unbounded_numbers(t.item_type, f"{path}[]")
    if isinstance(t, mi.TupleType):
        return [p for i, u in enumerate(t.item_types) for p in unbounded_numbers(u, f"{path}[{i}]")]
    return []


def test_every_numeric_field_has_a_range():
    """A huge value is refused at load (one error line), not met later as a hang or a traceback."""
    import msgspec.inspect as mi
    assert unbounded_numbers(mi.type_info(RunConfig)) == []


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
    ('[generator]\nbatch_size = "many"\n', r"generator\.batch_size = 'many': expected `int`, got `str`"),
    ('[eval]\nbaseline = "nope"\n', "eval.baseline must be one of"),
    ('[manager]\ntop_k = 0\n', r"manager.top_k = 0: must be in \[1, 1000\]"),
    ('[stage.answer]\nsteps = 0\n', r"stage.answer.steps = 0: must be in \[1, 1000000\]"),
    ('[reward]\nkind = "bleu"\n', "reward.kind = 'bleu': must be one of 'em', 'f1', 'judge'"),
    ('a = ' + '[' * 3000 + ']' * 3000 + '\n', "nested too deeply"),
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
    ("generator.batch_size=abc", r"^override 'generator.batch_size=abc': generator.batch_size = 'abc': expected `int`"),
    ("seed=x", r"^override 'seed=x': seed = 'x'"),
    ("learner.betas=[0.9, 1.5]", r"^override 'learner.betas=\[0.9, 1.5\]': learner.betas\[1\] = 1.5: must be in \[0, 1\)"),
])
def test_bad_overrides_name_the_problem(item, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, [item])


def test_an_override_is_blamed_for_its_own_error_and_the_file_for_its_own(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[stage.manager]\ngroup_size = 0\n")
    with pytest.raises(ConfigError, match=r"^\S*c\.toml: stage\.manager\.group_size = 0: must be in \[1, 1024\]$"):
        load_config(f, ["stage.manager.steps=3"])
    assert load_config(f, ["stage.manager.group_size=2"]).stage.manager.group_size == 2
    f.write_text("[stage.manager]\nsteps = 3\n")
    with pytest.raises(ConfigError, match=r"^override 'stage.manager.steps=x'"):
        load_config(f, ["stage.manager.steps=x"])


# Every range checked at load (so `--dry-run` refuses it before any engine starts): the key, the
# value given and the allowed range are named.
BAD_VALUES = [
    ("stage.manager.group_size", "0", "in [1, "), ("stage.answer.prompts_per_step", "0", "in [1, "),
    ("stage.answer.prompts_per_step", "-4", "in [1, "), ("stage.manager.steps", "0", "in [1, "),
    ("stage.answer_warm.steps", "-1", "in [1, "), ("stage.manager.lr", "-1e-5", "in (0, "),
    ("manager.max_new_tokens", "-1", "in [1, "), ("answer.max_new_tokens", "0", "in [1, "),
    ("extract.max_new_tokens", "0", "in [1, "), ("extract.context_turns", "-1", "in [0, "),
    ("rollout.temperature", "-0.5", "in [0, 100]"), ("rollout.top_p", "0", "in (0, 1]"), ("rollout.top_p", "1.5", "in (0, 1]"),
    ("rollout.top_k", "-3", "in [-1, "), ("rollout.top_k", "0", "-1 (off) or >= 1"),
    ("manager.top_k", "-1", "in [1, "), ("manager.top_k", "0", "in [1, "), ("answer.top_k_per_speaker", "0", "in [1, "),
    ("loop.max_staleness", "-1", "in [0, "), ("loop.sync_every", "0", "in [1, "), ("loop.checkpoint_every", "-1", "in [0, "),
    ("loop.validate_every", "-2", "in [0, "), ("loop.max_skipped", "-1", "in [0, "), ("generator.weight_bucket_mb", "0", "in [1, "),
    ("checkpoint.keep_last", "0", "in [1, "), ("generator.max_model_len", "0", "in [1, "), ("generator.batch_size", "0", "in [1, "),
    ("generator.gpu_memory_utilization", "1.5", "in (0, 1]"), ("generator.sleep_level", "3", "in [1, 2]"),
    ("learner.warmup_steps", "-1", "in [0, "), ("learner.grad_clip", "0", "in (0, "), ("learner.micro_batch_tokens", "0", "in [1, "),
    ("learner.loss.kl_coef", "-0.1", "in [0, "), ("learner.loss.clip_low", "1.5", "in [0, 1)"),
    ("learner.ppo.gamma", "1.5", "in [0, 1]"), ("learner.grpo.eps", "0", "in (0, "), ("items.max_questions_per_item", "0", "in [1, "),
    ("judge.retries", "-1", "in [0, "), ("reward.format_penalty", "-1", "in [0, "), ("eval.max_turns", "-1", "in [0, "),
    ("data.n", "0", "in [1, "), ("bank.hash_dim", "0", "in [1, "), ("manager.top_k", "99999999999999", "in [1, 1000]"),
    ("data.n", "1000000000", "in [1, 10000]"), ("bank.hash_dim", "1000000", "in [1, 65536]"),
    ("eval.resamples", "1e308", "expected `int`"), ("profile.steps", "[0]", "in [1, "), ("bank.fsync", '"bogus"', "one of"), ("seed", "-1", "in [0, "),
]


@pytest.mark.parametrize("key, value, allowed", BAD_VALUES)
def test_each_bad_value_names_its_key_value_and_range(tmp_path, key, value, allowed):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{key}={value}"])
    msg = str(e.value)
    assert key in msg and value.strip('"') in msg and allowed in msg, msg
    # the same value from a file is refused alike, blaming the file
    section, _, leaf = key.rpartition(".")
    f = tmp_path / "c.toml"
    f.write_text((f"[{section}]\n" if section else "") + f"{leaf} = {value}\n")
    with pytest.raises(ConfigError) as e:
        load_config(f)
    assert str(e.value).startswith(str(f)) and key in str(e.value) and allowed in str(e.value)


def test_dry_run_refuses_a_bad_value_in_one_line(capsys):
    from memr1.engine.cli import main
    assert main(["train", "--dry-run", "--config", str(ROOT / "configs" / "default.toml"),
                 "stage.manager.group_size=0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: override 'stage.manager.group_size=0': stage.manager.group_size = 0: must be in [1, 1024]"


def test_memory_r2s_recipe_plans_on_a_cpu_machine(capsys):
    """configs/locomo_logo.toml (a 7B model on GPUs) prints its plan here: the episode stage's curriculum."""
    from memr1.engine.cli import main
    assert main(["train", "--dry-run", "--config", str(ROOT / "configs" / "locomo_logo.toml")]) == 0
    out = capsys.readouterr().out
    assert "manager_episode    20 steps x 4 windows x 16 episodes" in out
    assert "phases: 8 sessions x 10 steps (lam 0.2), 16 sessions x 5 steps (lam 0.2), 32 sessions x 5 steps (lam 0.3)" in out


def test_data_seed_draws_another_whole_synthetic_set_for_the_run_s_items():
    """data.seed reaches the run's conversations (engine/items.py, as eval and train load them): every
    split is another set, and sample ids (which name the cached banks and facts) never collide."""
    from types import SimpleNamespace

    from memr1.engine.items import RunItems
    from memr1.rl.task.banks import safe_name

    assert load_config(None).data.seed == 0
    ids = {}
    for seed in (0, 1):
        run = SimpleNamespace(cfg=load_config(None, ["data.n=20", f"data.seed={seed}"]))
        ids[seed] = {split: [c.sample_id for c in RunItems(run, None, None, split).convs]
                     for split in ("train", "val", "test")}
    assert [len(ids[1][s]) for s in ("train", "val", "test")] == [16, 2, 2]
    for split in ("train", "val", "test"):
        assert len(ids[0][split]) == len(ids[1][split]) and not set(ids[0][split]) & set(ids[1][split])
        assert all(i.startswith("synth-1-") for i in ids[1][split])
        assert not {safe_name(i) for i in ids[0][split]} & {safe_name(i) for i in ids[1][split]}
    with pytest.raises(ConfigError, match="data.seed"):
        load_config(None, ["data.seed=-1"])


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent/run.toml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


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


def test_stage_names_parse_once_into_role_and_kind():
    from memr1.engine.config.stages import StageName, stage_name
    assert stage_name("manager") == StageName("manager", "rl") and not stage_name("manager").supervised
    assert stage_name("answer_warm") == StageName("answer", "warm") and stage_name("answer_warm").supervised
    control = stage_name("manager_control")
    assert control.supervised and control.of("warm") == "manager_warm" and control.of("rl") == "manager"
    with pytest.raises(ConfigError, match="unknown stage 'manager_warmup'"):
        stage_name("manager_warmup")
    with pytest.raises(ConfigError, match="manager_control continues manager_warm's checkpoint"):
        load_config(None, ['stages=["manager", "manager_control"]'])


def test_validate_stages_picks_the_rl_stages_that_validate():
    from memr1.engine.validation import validates
    stages = 'stages=["answer_warm", "answer", "manager_warm", "manager_episode"]'
    every = load_config(None, [stages, "loop.validate_every=5"])
    assert [validates(every, s) for s in every.stages] == [False, True, False, True]
    some = load_config(None, [stages, "loop.validate_every=5", 'loop.validate_stages=["manager_episode"]'])
    assert [validates(some, s) for s in some.stages] == [False, False, False, True]
    off = load_config(None, [stages, 'loop.validate_stages=["manager_episode"]'])
    assert not any(validates(off, s) for s in off.stages)
    for bad in ('["manager_warm"]', '["manager"]'):   # supervised; not a stage of this run
        with pytest.raises(ConfigError, match=r"loop\.validate_stages: \['manager.*'\] is not an RL stage of this run"):
            load_config(None, [stages, f"loop.validate_stages={bad}"])
    with pytest.raises(ConfigError, match=r"loop\.validate_start .*set loop\.validate_every too"):
        load_config(None, [stages, "loop.validate_start=true"])   # nothing would use the start's score


def test_a_control_takes_the_rl_stage_s_prompts_and_its_own_lr_or_the_warm_start_s():
    from memr1.engine.config.stages import stage_config
    stages = 'stages=["manager_warm", "manager", "manager_control"]'
    cfg = load_config(None, [stages, "stage.manager.steps=7", "stage.manager.prompts_per_step=3",
                             "stage.manager.lr=2e-6", "stage.manager_warm.lr=4e-4"])
    control = stage_config(cfg, "manager_control")
    assert (control.steps, control.prompts_per_step, control.group_size, control.lr) == (7, 3, 1, 4e-4)
    own = load_config(None, [stages, "stage.manager_warm.lr=4e-4", "stage.manager_control.lr=3e-5"])
    assert stage_config(own, "manager_control").lr == 3e-5
    assert stage_config(own, "answer_control").lr == own.stage.answer_warm.lr   # the other role keeps its default
    with pytest.raises(ConfigError, match="manager_control"):
        load_config(None, ["stage.manager_control.steps=3"])   # a control's steps are never its own


def test_a_stage_section_given_in_part_keeps_that_stage_s_defaults(tmp_path):
    """One key of a stage set (a TOML section or an override) leaves the stage's other settings at the
    stage's own defaults: a warm start's group_size stays 1, not the RL stages' 8."""
    from memr1.engine.config.stages import StagesConfig
    defaults = StagesConfig()
    cfg = load_config(None, ["stage.manager_warm.lr=4e-4", "stage.manager.steps=3"])
    assert cfg.stage.manager_warm == msgspec.structs.replace(defaults.manager_warm, lr=4e-4)
    assert cfg.stage.manager == msgspec.structs.replace(defaults.manager, steps=3)
    f = tmp_path / "c.toml"
    f.write_text("[stage.answer_warm]\nsteps = 5\n")
    assert load_config(f).stage.answer_warm == msgspec.structs.replace(defaults.answer_warm, steps=5)


def test_reading_a_run_config_imports_no_torch():
    """The run config, its resolution and every component config they compose live in torch-free
    modules: reading a TOML loads no torch (a package __init__ that re-exports torch code would)."""
    code = ("import sys\n"
            "import memr1.engine.config.resolve\n"
            "from memr1.engine.config.run import load_config\n"
            "for path in sys.argv[1:]:\n"
            "    load_config(path)\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'vllm'))\n"
            "assert not heavy, f'imported {heavy[:5]}'\n")
    configs = sorted(str(p) for p in (ROOT / "configs").glob("*.toml"))
    out = subprocess.run([sys.executable, "-c", code, *configs], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.parametrize("override, says", [
    ("run_dir={tmp}/FILE/run", "FILE is not a folder"),
    ("run_dir=/proc/memr1", "cannot write there"),
    ("cache_dir={tmp}/FILE", "exists and is not a folder"),
])
def test_dry_run_checks_the_paths_a_run_would_write_and_creates_none(tmp_path, capsys, override, says):
    from memr1.engine.cli import main
    (tmp_path / "FILE").write_text("x")
    before = sorted(tmp_path.rglob("*"))
    assert main(["train", "--dry-run", "--config", str(ROOT / "configs" / "default.toml"),
                 override.format(tmp=tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and says in err and "\n" not in err
    ok = tmp_path / "new" / "run"
    assert main(["train", "--dry-run", "--config", str(ROOT / "configs" / "default.toml"), f"run_dir={ok}"]) == 0
    assert sorted(tmp_path.rglob("*")) == before   # a dry run creates nothing


@pytest.mark.parametrize("key", ["name", "run_dir", "cache_dir"])
def test_a_name_or_path_that_is_not_utf8_is_one_error(key):
    bad = b"run-\xff".decode("utf-8", "surrogateescape")   # what argv gives for those bytes
    with pytest.raises(ConfigError, match=f"{key} is not valid UTF-8"):
        load_config(None, [f"{key}={bad}"])


def test_train_layers_beyond_the_model_is_one_error_before_training_only(tiny_model):
    from memr1.engine.config.resolve import resolve
    cfg = load_config(ROOT / "configs" / "outcome.toml", [f"generator.model={tiny_model}"])   # train_layers = 10
    with pytest.raises(ValueError, match="learner.train_layers=10: the model .* has 2 decoder blocks"):
        resolve(cfg)
    resolve(load_config(ROOT / "configs" / "outcome.toml", [f"generator.model={tiny_model}", "learner.train_layers=2"]))
    resolve(cfg, trains=False)   # rollout and eval never read the learner's settings
