"""bench.episodes: a tiny run through main writes the JSON contract with every impl doing the same work,
all impls return the same search ids, the headline names its rows; the script is seeded and its ops
hit live ids; the numpy bank ranks as brute force does and its snapshots are independent copies; a
step releases every snapshot file, and retain="window" holds two sessions' worth; the agreement check
tells a near-tie from a wrong answer; the generation row's timer splits an EpisodeStage rollout (a
scripted policy here) and puts MemoryBank back as it was, and a changed EpisodeStage API stops
--generation with one line before the grid runs. The copy-on-write bank and the headline's ratios:
test_bench_episodes_cow.py."""
import copy
import itertools
import json
import pickle
from types import SimpleNamespace

import numpy as np
import pytest

import memr1.bench.episodes
import memr1.rl.task.stages.episode
from memr1.bench.episode_workload import IMPLS, SPEAKERS, MatrixBank, Shape, Side, make_script, prepare, replay
from memr1.bench.episode_generation import BANK_CALLS, timed_rollout
from memr1.bench.episodes import compare, main
from memr1.memory_store import HashEmbedder, MemoryBank
from memr1.rl.task.agents.answer import AnswerConfig
from memr1.rl.task.agents.manager import ManagerConfig
from memr1.rl.task.data import load_conversations
from memr1.rl.task.stages.episode import EpisodeStage
from memr1.rl.task.episodes import EpisodeConfig, episode_items
from memr1.rl.task.facts import oracle_facts
from memr1.rl.task.stages.calls import StageConfig
from memr1.rl.task.turns import Task
from memr1.rl.task.stages.context import StageContext
from scripted import ScriptedGenerator

KEYS = {"impl", "sessions", "group", "inner_n", "episodes_per_s", "peak_rss_mb", "rss_growth_mb", "snapshot_s",
        "search_s", "op_s", "n_snapshots", "bank_rows_final", "bytes_per_snapshot", "rows_written", "step_s_spread",
        "first_step_s"}


@pytest.mark.slow   # 9 bench subprocesses, ~3 s
def test_tiny_run_writes_rows_agreement_and_headline(tmp_path):
    out = tmp_path / "episodes.json"
    assert main(["--sessions", "2", "--group", "2", "--inner-n", "2", "--calls", "2", "--local-questions", "4",
                 "--global-questions", "8", "--rounds", "3", "--steps", "2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["bench"] == "episodes" and {"machine", "settings", "rows", "headline", "agreement"} <= data.keys()
    assert (data["settings"]["rounds"], data["settings"]["steps"]) == (3, 2)
    rows = {r["impl"]: r for r in data["rows"]}
    assert set(rows) == set(IMPLS) and len(data["rows"]) == len(IMPLS)
    for r in rows.values():
        assert KEYS <= r.keys(), KEYS - r.keys()
        assert (r["sessions"], r["group"], r["inner_n"], r["n_snapshots"], r["rounds"], r["steps_per_round"]) == \
            (2, 2, 2, 4, 3, 2)
        assert r["episodes_per_s"] > 0 and r["peak_rss_mb"] > 0 and r["bank_rows_final"] > 0
        assert r["n_restores"] > 0 and r["first_step_s"] > 0 and r["step_s_spread"][0] <= r["step_s"]
    for key in ("n_searches", "n_ops", "rows_written", "n_restores", "bank_rows_final"):  # the same work
        assert len({r[key] for r in rows.values()}) == 1, key
    check = data["agreement"]["S2"]
    assert check["checked"] == check["searches"] > 0
    for impl in IMPLS[1:]:
        assert check[f"memr1_vs_{impl}"] == {"same": check["checked"], "tie": 0, "differ": 0}
    head = {h["name"]: h for h in data["headline"]}
    assert set(head) == {f"S=2: {what}" for short in ("pickle", "deepcopy", "cow") for what in (
        f"memr1 over {short}, snapshot+restore+drop", f"RSS growth per row written, {short} over memr1")}
    h = head["S=2: memr1 over cow, snapshot+restore+drop"]
    assert (h["ours"], h["baseline"], h["target"]) == ("memr1 S=2", "cow_numpy S=2", None)
    assert np.isclose(h["value"], rows["cow_numpy"]["snapshot_s"] / rows["memr1"]["snapshot_s"])
    assert np.isclose(h["step_ratio"], rows["memr1"]["episodes_per_s"] / rows["cow_numpy"]["episodes_per_s"])
    assert np.isclose(h["free_snapshot_ratio"], rows["cow_numpy"]["step_s"] /
                      (rows["memr1"]["step_s"] - rows["memr1"]["snapshot_s"]))
    for side, impl in (("ours", "memr1"), ("baseline", "cow_numpy")):
        assert h[f"{side}_floor_share"] == rows[impl]["snapshot_floor_share"]
        assert 0 < rows[impl]["snapshot_floor_share"] < 1 and 0 < rows[impl]["call_floor_s"] < 1e-5
        assert rows[impl]["snapshot_calls"] == 2 * rows[impl]["n_snapshots"] + rows[impl]["n_restores"]
    assert [p.name for p in tmp_path.iterdir()] == ["episodes.json"]   # the snapshot files are gone


def test_script_is_seeded_and_targets_live_ids():
    a, b = make_script(Shape(3, 4, 2)), make_script(Shape(3, 4, 2))
    assert a.sessions == b.sessions and a.rerolls == b.rerolls and np.array_equal(a.vecs, b.vecs)
    assert np.allclose(np.linalg.norm(a.vecs, axis=1), 1, atol=1e-5)

    def replay_ids(live: set, calls) -> set:
        for _, _, ops in calls:
            for kind, mid, _ in ops:
                assert kind == "add" or kind == "none" or mid in live
                live = live | {mid} if kind == "add" else live - {mid} if kind == "delete" else live
        return live
    after = []   # [episode][session] -> live ids after it
    for ep in a.sessions:
        after.append(list(itertools.accumulate(ep, replay_ids, initial=set()))[1:])
    assert a.rerolls
    for k, (e, group, questions) in a.rerolls.items():   # a re-run starts from its episode's bank at k - 1
        for calls in group:
            replay_ids(after[e][k - 1] if k else set(), calls)


VECS = np.random.default_rng(0).standard_normal((1000, 384)).astype(np.float32)
VECS /= np.linalg.norm(VECS, axis=1, keepdims=True)


def random_ops(bank: MatrixBank, truth: dict, n: int, rng, fresh) -> None:
    """n ADD/UPDATE/DELETE ops on `bank` and on `truth` (id -> (speaker, vector row)), on live ids; each
    op's vector is a new row of VECS (`fresh`), so no two memories tie exactly."""
    for _ in range(n):
        kind, row = rng.choice(["add", "add", "add", "update", "delete"]), next(fresh)
        if kind == "add" or not truth:
            speaker = SPEAKERS[int(rng.integers(2))]
            truth[bank.apply(("add", -1, VECS[row], "t", speaker))] = (speaker, row)
        else:
            mid = int(rng.choice(list(truth)))
            speaker = truth[mid][0]
            assert bank.apply((kind, mid, VECS[row] if kind == "update" else None, "t", speaker)) == mid
            truth[mid] = (speaker, row)
            if kind == "delete":
                del truth[mid]


def assert_matches(bank: MatrixBank, truth: dict) -> None:
    """Every speaker's whole ranking, for a few queries, as brute force over `truth` ranks it."""
    assert len(bank) == len(truth)
    for q in VECS[:3]:
        for s in SPEAKERS:
            mine = {i: float(VECS[r] @ q) for i, (sp, r) in truth.items() if sp == s}
            ids, scores = bank.search(q, 1000, s)
            assert ids.tolist() == sorted(mine, key=lambda i: -mine[i])
            assert np.allclose(scores, [mine[i] for i in ids.tolist()], atol=1e-5)


def test_matrix_bank_matches_brute_force_and_its_snapshots_are_independent():
    rng, bank, truth, fresh = np.random.default_rng(1), MatrixBank(), {}, itertools.count(3)  # 0-2: queries
    random_ops(bank, truth, 300, rng, fresh)   # past several capacity doublings, deletes moving rows
    assert_matches(bank, truth)
    for snap in (copy.deepcopy(bank), pickle.loads(pickle.dumps(bank, protocol=pickle.HIGHEST_PROTOCOL))):
        assert_matches(snap, truth)
        mine = dict(truth)
        random_ops(snap, mine, 100, rng, fresh)
        assert_matches(snap, mine)
        assert_matches(bank, truth)   # the bank sees none of it
        assert snap.next_id > bank.next_id
    random_ops(bank, truth, 100, rng, fresh)   # nor do the snapshots share anything the bank writes to later
    assert_matches(bank, truth)


def test_replay_window_keeps_two_sessions_of_snapshots_and_the_same_work(tmp_path):
    shape = Shape(2, 4, 2, calls=2, local_questions=2, global_questions=2, reroll_prob=1.0)
    script, got = make_script(shape), {}
    for retain in ("step", "window"):
        side = Side("pickle_snapshots", str(tmp_path))
        got[retain] = replay(shape, prepare(script, side), side, retain)
        assert list(tmp_path.iterdir()) == []   # every snapshot file released by the step's end
    assert got["step"]["snapshots_held_max"] == 8 and got["window"]["snapshots_held_max"] == 4
    assert got["step"]["n_restores"] == got["window"]["n_restores"] == 8
    for key in ("n_searches", "n_ops", "rows_written", "n_snapshots", "bank_rows_final", "snapshot_bytes"):
        assert got["step"][key] == got["window"][key], key


def test_compare_tells_near_ties_from_wrong_answers():
    assert compare([1, 2, 3], [0.9, 0.8, 0.7], [1, 2, 3], [0.9, 0.8, 0.7]) == "same"
    assert compare([1, 2, 3], [0.9, 0.8, 0.7], [1, 3, 2], [0.9, 0.8, 0.8 - 1e-7]) == "differ"
    assert compare([1, 2, 3], [0.9, 0.8, 0.8 - 1e-7], [1, 3, 2], [0.9, 0.8, 0.8 - 1e-7]) == "tie"
    assert compare([1, 2, 3], [0.9, 0.8, 0.7], [1, 2, 4], [0.9, 0.8, 0.7 - 1e-7]) == "tie"   # at the k-th place
    assert compare([1, 2, 3], [0.9, 0.8, 0.7], [1, 2, 4], [0.9, 0.8, 0.6]) == "differ"
    assert compare([1, 2], [0.9, 0.8], [1, 2, 4], [0.9, 0.8, 0.6]) == "differ"
    assert compare([1, 2, 3], [0.9, 0.8, 0.7], [1, 3, 2], [0.9, 0.7, 0.8]) == "differ"   # right scores, wrong order


def test_timed_rollout_splits_the_time_and_restores_what_it_wrapped():
    convs = load_conversations(None, 10, split="train")
    items = episode_items(convs, {c.sample_id: oracle_facts(c) for c in convs}, 2, sessions=2)[:1]
    embedder, frozen = HashEmbedder(64), ScriptedGenerator(["Answer: none"])
    task = Task(manager=ManagerConfig(top_k=5, turns_per_call=2, max_new_tokens=64),
                answer=AnswerConfig(max_new_tokens=4, distill=False))
    stage = EpisodeStage(lambda s: items, frozen, StageContext(embedder, task),
                         StageConfig(steps=1, prompts_per_step=1, group_size=2),
                         EpisodeConfig(sessions=2, inner_n=2, reroll_prob=1.0))
    policy = ScriptedGenerator([json.dumps({"memory": [{"id": "90", "text": "a note", "event": "ADD"}]})])
    before = {n: MemoryBank.__dict__[n] for n in BANK_CALLS}
    row = timed_rollout(stage, policy)
    assert row["impl"] == "memr1_with_generation" and (row["group"], row["inner_n"], row["episodes"]) == (2, 2, 2)
    assert row["forks"] > 0 and row["bank_ops"] > 0 and row["bank_calls"] > 0 and row["generate_calls"] > 0
    assert 0 < row["bank_share"] < 1 and 0 < row["gen_share"] < 1 and row["step_s"] > 0
    assert abs(row["gen_share"] + row["bank_share"] + row["embed_share"] + row["other_share"] - 1) < 1e-9
    assert {n: MemoryBank.__dict__[n] for n in BANK_CALLS} == before
    assert stage.frozen is frozen and "embed" not in vars(embedder)


def test_generation_with_a_changed_stage_api_fails_in_one_line_before_the_grid(tmp_path, monkeypatch, capsys):
    class Moved:
        def __init__(self, items_for, frozen_answer, ctx, *, seed=0):   # lost cfg and episode
            pass
    monkeypatch.setattr(memr1.rl.task.stages.episode, "EpisodeStage", Moved)

    def grid(shape):
        raise AssertionError("the grid started before the API was checked")
    monkeypatch.setattr(memr1.bench.episodes, "make_script", grid)
    out = tmp_path / "episodes.json"
    assert main(["--sessions", "2", "--group", "2", "--generation", "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --generation needs memr1.rl.task.stages.episode.EpisodeStage(")
    assert "TypeError" in err[0] and not out.exists()


def test_timed_rollout_restores_what_it_wrapped_when_the_metrics_moved():
    frozen, embedder = ScriptedGenerator(["x"]), HashEmbedder(8)
    stage = SimpleNamespace(frozen=frozen, ctx=SimpleNamespace(embedder=embedder), cfg=StageConfig(steps=1, group_size=2),
                            episode=EpisodeConfig(), rollout=lambda step, gen: SimpleNamespace(metrics={"sessions": 1}))
    before = {n: MemoryBank.__dict__[n] for n in BANK_CALLS}
    with pytest.raises(LookupError, match="gen_s"):
        timed_rollout(stage, ScriptedGenerator(["y"]))
    assert {n: MemoryBank.__dict__[n] for n in BANK_CALLS} == before
    assert stage.frozen is frozen and "embed" not in vars(embedder)
