"""`memr1 report` and `memr1 rollout` on hostile folders (issue 67, items 11-13): nothing is written
through a link planted in the output folder; a shard is done only when its footer reads and holds the
rows its manifest records; a hostile rollout or run folder gives one `error:` line (exit 2) or a report,
never a traceback or a hang. Cases that would hang on a FIFO run in a subprocess with a timeout."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memr1.engine.cli import main
from memr1.engine.rollout_files import done, open_dir, recorded, shard_name, write_json, write_shard
from memr1.engine.rollout_summary import summarize
from memr1.memory_store import HashEmbedder
from memr1.rl.task.agents.answer import AnswerConfig
from memr1.rl.task.agents.manager import ManagerConfig
from memr1.rl.task.data import load_conversations
from memr1.rl.task.facts import oracle_facts
from memr1.rl.task.train_items import ItemsConfig, manager_calls, manager_items, oracle_bank
from memr1.rl.task.stages.calls import ManagerStage, StageConfig
from memr1.rl.task.turns import Task
from memr1.rl.task.stages.context import StageContext
from report_fixture import make_run
from run_helpers import env
from scripted import ScriptedGenerator

TASK = Task(manager=ManagerConfig(top_k=5, turns_per_call=2, max_new_tokens=64),
            answer=AnswerConfig(max_new_tokens=4, distill=False))
ROOT = Path(__file__).resolve().parent.parent


def replies(call, i, j):
    event = ("ADD", "NONE")[j % 2]
    return json.dumps({"memory": [{"id": "90", "text": f"fact {i}-{j}", "event": event}]})


@pytest.fixture(scope="module")
def rollouts():
    """Two steps' rollouts of a scripted manager stage (no model)."""
    embedder = HashEmbedder(64)
    convs = load_conversations(None, n=3, split="train")
    specs = manager_calls(convs, {c.sample_id: oracle_facts(c) for c in convs}, 2)
    items = manager_items(specs, [oracle_bank(s, s.conv, embedder) for s in specs], ItemsConfig(), 0)[:4]
    stage = ManagerStage(items, ScriptedGenerator(["Answer: none"]), StageContext(embedder, TASK),
                         StageConfig(prompts_per_step=2, group_size=3))
    return [stage.rollout(step, ScriptedGenerator(reply=replies)) for step in range(2)]


@pytest.fixture
def folder(tmp_path, rollouts):
    out = tmp_path / "rollouts"
    open_dir(out, {"stage": "manager", "models": {"base": "ab" * 32}}, "c0ffee", paths={"base": "/m"})
    for step, r in enumerate(rollouts):
        write_shard(out, step, 0, r, 1.0)
    summarize(out, {"steps": 2, "skipped": 0, "rows": 12, "response_tokens": 10, "forks": 12, "bank_ops": 6,
                    "step_s": 2.0, "write_s": 0.1, "setup_s": 1.0})
    return out


def one_error_line(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def plant(folder: Path, names, victim: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).symlink_to(victim)


# ---- nothing written through a planted link ------------------------------------------------------
def test_a_rollout_report_replaces_links_planted_in_its_folder(folder, tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    plant(folder / "report", ["report.md", "reward_by_op.png", "phases.png"], victim)
    assert main(["report", str(folder)]) == 0
    assert victim.read_text() == "keep"
    for name in ("report.md", "reward_by_op.png", "phases.png"):
        assert not (folder / "report" / name).is_symlink() and (folder / "report" / name).stat().st_size > 0


def test_a_run_report_replaces_links_planted_in_its_folder(tmp_path):
    run = make_run(tmp_path / "run", steps=4)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    names = ["report.md", "summary.json", "curves_manager.png", "time_manager.png", "eval_categories.png"]
    plant(run / "report", names, victim)
    assert main(["report", str(run)]) == 0
    assert victim.read_text() == "keep"
    assert all(not (run / "report" / n).is_symlink() for n in names)


@pytest.mark.parametrize("kind", ["run", "rollout"])
def test_a_default_report_folder_that_is_a_link_is_refused(folder, tmp_path, capsys, kind):
    target = make_run(tmp_path / "run", steps=4) if kind == "run" else folder
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (target / "report").symlink_to(elsewhere)
    assert "symbolic link" in one_error_line(capsys, ["report", str(target)])
    assert not list(elsewhere.iterdir())


def test_rollout_writes_nothing_through_planted_temporary_files(folder, rollouts, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    # the names the writers used before: fixed, so anyone could plant them
    plant(folder, [".summary.json.tmp", ".manifest.json.tmp", f".{shard_name('completions', 1, 0)}.tmp",
                   f".{shard_name('prompts', 1, 0)}.tmp"], victim)
    write_shard(folder, 1, 0, rollouts[1], 1.0)
    summarize(folder)
    assert victim.read_text() == "keep"
    (folder / "summary.json").unlink()
    (folder / "summary.json").symlink_to(victim)
    write_json(folder / "summary.json", {"x": 1})
    assert victim.read_text() == "keep" and json.loads((folder / "summary.json").read_text()) == {"x": 1}


def test_run_log_is_not_opened_through_a_link_or_as_a_fifo(tmp_path):
    from memr1.engine.observe.quiet import open_log

    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "link.log").symlink_to(victim)
    os.mkfifo(tmp_path / "fifo.log")
    for name in ("link.log", "fifo.log"):
        with pytest.raises(OSError):
            open_log(tmp_path / name)
    assert victim.read_text() == "keep"
    with open_log(tmp_path / "run.log") as f:
        f.write("ok\n")


# ---- shards verified on resume -------------------------------------------------------------------
def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def other_rows(path: Path) -> None:   # a whole Parquet file of another step's rows
    pq.write_table(pq.read_table(path).slice(0, 1), path)


@pytest.mark.parametrize("damage", [
    lambda f: truncate(f / shard_name("completions", 0, 0)),
    lambda f: truncate(f / shard_name("prompts", 0, 0)),
    lambda f: (f / shard_name("completions", 0, 0)).write_bytes(b""),
    lambda f: other_rows(f / shard_name("completions", 0, 0)),
    lambda f: (f / shard_name("completions", 0, 0)).unlink() or os.mkfifo(f / shard_name("completions", 0, 0)),
    lambda f: (f / "shards-r0.json").unlink(),
    lambda f: (f / "shards-r0.json").write_text('["not", "a", "record"]'),
], ids=["completions truncated", "prompts truncated", "empty", "other rows", "a FIFO", "no record",
        "record a list"])
def test_a_damaged_shard_is_not_done(folder, damage):
    assert done(folder, 0, 0) and done(folder, 1, 0)
    damage(folder)
    assert not done(folder, 0, 0)
    assert done(folder, 1, 0) or not recorded(folder, 0)


def test_a_redone_step_is_recorded_and_done_again(folder, rollouts):
    truncate(folder / shard_name("completions", 0, 0))
    write_shard(folder, 0, 0, rollouts[0], 1.0)
    assert done(folder, 0, 0) and done(folder, 1, 0)


# ---- hostile rollout folders: one line or a report -----------------------------------------------
def edit_json(path: Path, change) -> None:
    value = json.loads(path.read_text())
    path.write_text(json.dumps(change(value)))


def rewrite_shard(folder: Path, change) -> None:
    path = folder / shard_name("completions", 1, 0)
    pq.write_table(change(pq.read_table(path)), path)


def set_column(name, array):
    return lambda t: t.set_column(t.column_names.index(name), name, array(t))


HOSTILE = {
    "shard truncated": lambda f: truncate(f / shard_name("completions", 1, 0)),
    "shard empty": lambda f: (f / shard_name("completions", 1, 0)).write_bytes(b""),
    "shard a folder": lambda f: (f / shard_name("completions", 1, 0)).unlink() or
    (f / shard_name("completions", 1, 0)).mkdir(),
    "reward a string in one shard": lambda f: rewrite_shard(f, set_column(
        "reward", lambda t: pa.array([str(x) for x in t.column("reward").to_pylist()]))),
    "reward missing": lambda f: rewrite_shard(f, lambda t: t.drop_columns(["reward"])),
    "reward null": lambda f: rewrite_shard(f, set_column("reward", lambda t: pa.nulls(len(t), pa.float64()))),
    "reward NaN": lambda f: rewrite_shard(f, set_column("reward", lambda t: pa.array([float("nan")] * len(t)))),
    "events an integer": lambda f: rewrite_shard(f, set_column("events", lambda t: pa.array([1] * len(t)))),
    "a reward part a string": lambda f: rewrite_shard(f, lambda t: t.append_column("reward_x", pa.array(["a"] * len(t)))),
    "manifest what a string": lambda f: edit_json(f / "manifest.json", lambda m: {**m, "what": "x"}),
    "manifest models a list": lambda f: edit_json(f / "manifest.json", lambda m: {**m, "what": {"models": [1]}}),
    "manifest paths a list": lambda f: edit_json(f / "manifest.json", lambda m: {**m, "paths": [1]}),
    "manifest a list": lambda f: (f / "manifest.json").write_text("[1]"),
    "manifest nested deep": lambda f: (f / "manifest.json").write_text("[" * 100_000),
    "manifest not UTF-8": lambda f: (f / "manifest.json").write_bytes(b"\xff{"),
    "summary a list": lambda f: (f / "summary.json").write_text("[1]"),
    "summary throughput a string": lambda f: (f / "summary.json").write_text('{"throughput": "fast"}'),
    "summary throughput of strings": lambda f: (f / "summary.json").write_text(
        '{"throughput": {"rollouts_per_s": "fast", "setup_s": [1]}}'),
    "summary nested deep": lambda f: (f / "summary.json").write_text("[" * 100_000),
}


@pytest.mark.parametrize("damage", list(HOSTILE))
def test_a_hostile_rollout_folder_is_reported_or_one_error_line(folder, capsys, damage):
    HOSTILE[damage](folder)
    code = main(["report", str(folder)])
    out, err = capsys.readouterr()
    if code == 2:
        assert err.startswith("error: ") and err.count("\n") == 1, err
    else:
        assert code == 0 and (folder / "report" / "report.md").is_file() and "wrote" in out, err


def test_report_out_under_a_file_is_one_error_line(folder, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file", tmp_path / "file" / "sub"):
        assert str(tmp_path / "file") in one_error_line(capsys, ["report", str(folder), "--out", str(out)])


def fifo(path: Path) -> None:
    if path.is_dir():
        import shutil
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    os.mkfifo(path)


# One subprocess reports on every folder in turn, printing each one's exit status and stderr as a line
# of JSON; a hang stops it, and the timeout names the folder it stopped at.
REPORT_EACH = """
import contextlib, io, json, sys
from memr1.engine.cli import main
for folder in sys.argv[1:]:
    print(json.dumps({"folder": folder, "start": True}), flush=True)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["report", folder])
    print(json.dumps({"folder": folder, "code": code, "err": err.getvalue()}), flush=True)
"""


def test_fifos_in_rollout_and_run_folders_neither_hang_nor_trace(folder, tmp_path):
    cases = []
    for name in (shard_name("completions", 1, 0), "summary.json", "manifest.json"):
        f = tmp_path / f"rollout-{name}"
        subprocess.run(["cp", "-r", str(folder), str(f)], check=True)
        fifo(f / name)
        cases.append(f)
    for name in ("metrics.jsonl", "config.toml", "eval/val.base.json", "eval/summary.json"):
        run = make_run(tmp_path / f"run-{name.replace('/', '-')}", steps=4)
        fifo(run / name)
        cases.append(run)
    run = make_run(tmp_path / "run-trace", steps=4)
    fifo(next((run / "profile").glob("*/step_*.json")))
    cases.append(run)
    try:
        proc = subprocess.run([sys.executable, "-c", REPORT_EACH, *map(str, cases)], cwd=ROOT, env=env(),
                              capture_output=True, text=True, timeout=300)  # a hang never ends; 300 s is for a loaded machine
    except subprocess.TimeoutExpired as e:
        lines = (e.stdout or b"").decode().splitlines() if isinstance(e.stdout, bytes) else (e.stdout or "").splitlines()
        pytest.fail(f"memr1 report hung on {json.loads(lines[-1])['folder'] if lines else cases[0]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [r for r in map(json.loads, proc.stdout.splitlines()) if "code" in r]
    assert len(results) == len(cases)
    for r in results:
        assert r["code"] in (0, 2) and "Traceback" not in r["err"], r
        if r["code"] == 2:
            assert r["err"].startswith("error: ") and r["err"].count("\n") == 1, r


# ---- the command ---------------------------------------------------------------------------------
def command(tiny_model, out, items=4):
    from run_helpers import overrides
    return ["rollout", "--config", "configs/default.toml", "--stage", "manager", "--split", "train", "--items",
            str(items), "--out", str(out), *overrides(tiny_model, out, 1, ("manager",)),
            "items.bank_pipeline=oracle", "items.answer_banks=oracle", "stage.manager.group_size=3"]


def test_a_truncated_shard_is_rolled_out_again_on_a_rerun(tiny_model, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "out"
    assert main(command(tiny_model, out)) == 0
    volatile = {"t_prompt_s", "t_generate_s", "t_fork_apply_s", "t_frozen_s", "t_reward_s", "t_step_s"}
    rows = lambda: [{k: v for k, v in r.items() if k not in volatile}   # noqa: E731
                    for f in sorted(out.glob("completions-*.parquet")) for r in pq.read_table(f).to_pylist()]
    before = rows()
    truncate(out / shard_name("completions", 0, 0))
    capsys.readouterr()
    assert main(command(tiny_model, out)) == 0
    printed = capsys.readouterr().out
    assert printed.count("step ") == 1 and "step 1/2:" in printed, printed
    assert rows() == before
    assert json.loads((out / "summary.json").read_text())["throughput"]["skipped_steps"] == 1


@pytest.mark.parametrize("where", ["{tmp}/file/sub", "/proc/memr1-rollouts", "/proc/self/memr1"])
def test_rollout_out_where_no_file_can_be_written_is_one_error_line(tmp_path, capsys, monkeypatch, where):
    monkeypatch.chdir(ROOT)
    (tmp_path / "file").write_text("x")
    out = where.format(tmp=tmp_path)
    err = one_error_line(capsys, ["rollout", "--config", "configs/default.toml", "--stage", "manager", "--items", "2",
                                  "--out", out])
    assert "--out" in err and not os.path.exists(out)
