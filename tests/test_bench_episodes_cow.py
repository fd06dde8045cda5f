"""bench.episodes' copy-on-write numpy bank (bench.matrix_bank.CowBank): through random ops, snapshots
(folds included) and restores, every bank and snapshot ranks as the plain numpy bank and brute force
do; a snapshot and its parent never see each other's later writes; on the bench's own script its
searches agree with memr1's; the headline puts the snapshot cost and RSS growth per row against it."""
import copy
import itertools

import numpy as np

from memr1.bench.episode_workload import Shape, make_script
from memr1.bench.episodes import BASELINES, agreement, headline, with_generation
from memr1.bench.matrix_bank import SPEAKERS, CowBank, MatrixBank
from test_bench_episodes import VECS, assert_matches, random_ops


class Twin:
    """The same ops on a CowBank and a MatrixBank, which must return the same ids."""

    def __init__(self, cow: CowBank, mat: MatrixBank):
        self.cow, self.mat = cow, mat

    def apply(self, op):
        got = self.cow.apply(op)
        assert got == self.mat.apply(op)
        return got


def assert_same(twin: Twin, truth: dict) -> None:
    assert_matches(twin.cow, truth)
    for q in VECS[:3]:
        for s in SPEAKERS:
            for k in (1, 5, 1000):
                a, b = twin.cow.search(q, k, s), twin.mat.search(q, k, s)
                assert a[0].tolist() == b[0].tolist() and np.allclose(a[1], b[1], atol=1e-6)
    for mid in truth:
        assert twin.cow.text(mid) == "t"


def test_cow_bank_ranks_as_the_numpy_bank_through_ops_snapshots_and_restores():
    rng, fresh = np.random.default_rng(7), itertools.count(3)   # VECS rows 0-2: the queries
    live, frozen, folds = [(Twin(CowBank(), MatrixBank()), {})], [], 0
    for _ in range(120):
        twin, truth = live[int(rng.integers(len(live)))]
        if rng.random() < 0.3:   # a snapshot kept as it is, and a restore of it that goes on writing
            before = id(twin.cow.base)
            snap = twin.cow.snapshot()
            folds += id(twin.cow.base) != before
            frozen.append((Twin(snap, copy.deepcopy(twin.mat)), dict(truth)))
            live.append((Twin(snap.copy(), copy.deepcopy(twin.mat)), dict(truth)))
        else:
            random_ops(twin, truth, int(rng.integers(1, 12)), rng, fresh)
        assert_same(twin, truth)
    assert folds >= 3 and len(frozen) >= 20
    for twin, truth in live + frozen:   # nothing written later shows in an earlier snapshot, or back
        assert_same(twin, truth)


def test_a_snapshots_writes_never_show_in_its_parent_nor_the_parents_in_it():
    rng, fresh = np.random.default_rng(3), itertools.count(3)
    bank, truth = CowBank(), {}
    random_ops(bank, truth, 60, rng, fresh)
    bank.fold()   # a base to tombstone, then an overlay over it
    random_ops(bank, truth, 10, rng, fresh)
    snap, at_snap = bank.snapshot(), dict(truth)
    child, mine = snap.copy(), dict(truth)
    for mid in list(mine)[:20]:   # base and overlay rows alike, updated and deleted
        r = next(fresh)
        if mid % 2:
            assert child.apply(("delete", mid, None, "t", mine.pop(mid)[0])) == mid
        else:
            assert child.apply(("update", mid, VECS[r], "t", mine[mid][0])) == mid
            mine[mid] = (mine[mid][0], r)
    random_ops(child, mine, 40, rng, fresh)
    child.fold()
    assert_matches(child, mine)
    assert_matches(snap, at_snap)
    assert_matches(bank, truth)
    random_ops(bank, truth, 40, rng, fresh)
    bank.fold()
    assert_matches(bank, truth)
    assert_matches(snap, at_snap)
    assert_matches(child, mine)


def test_cow_bank_agrees_with_memr1_on_the_bench_script(tmp_path):
    script = make_script(Shape(3, 6, 2, calls=4, local_questions=4, global_questions=8, reroll_prob=1.0))
    check = agreement(script, str(tmp_path), 10**6)
    assert check["checked"] == check["searches"] > 0
    assert check["memr1_vs_cow_numpy"]["differ"] == 0 and check["memr1_vs_cow_numpy"]["same"] > 0


def row(step_s: float, snap_s: float, growth_mb: float, rows_written: int = 512) -> dict:
    return {"episodes_per_s": 16 / step_s, "step_s": step_s, "snapshot_s": snap_s,
            "snapshot_s_per_episode": snap_s / 16,
            "snapshot_floor_share": 1e-4 / snap_s, "rss_growth_mb": growth_mb, "n_snapshots": 96, "n_restores": 32,
            "rss_kb_per_row_written": growth_mb * 1024 / rows_written}


def test_headline_puts_snapshot_cost_and_rss_per_row_against_each_baseline():
    mine = {"memr1": row(0.4, 0.004, 1.0), "pickle_snapshots": row(2.0, 1.6, 4.0), "deepcopy": row(0.8, 0.4, 16.0),
            "cow_numpy": row(0.5, 0.006, 0.5)}
    head = {h["name"]: h for h in headline(mine, 32)}
    assert len(head) == 2 * len(BASELINES) == 6
    cow = head["S=32: memr1 over cow, snapshot+restore+drop"]
    assert np.isclose(cow["value"], 1.5) and cow["target"] == 2.0 and cow["met"] is False
    assert (cow["ours"], cow["baseline"]) == ("memr1 S=32", "cow_numpy S=32")
    assert np.isclose(cow["ours_floor_share"], 0.025) and np.isclose(cow["baseline_floor_share"], 1e-4 / 0.006)
    assert np.isclose(cow["baseline_s_per_episode"], 0.006 / 16)
    assert np.isclose(cow["step_ratio"], 0.5 / 0.4) and np.isclose(cow["free_snapshot_ratio"], 0.5 / 0.396)
    deep = head["S=32: memr1 over deepcopy, snapshot+restore+drop"]
    assert np.isclose(deep["value"], 100) and deep["target"] is None and deep["met"] is None
    grow = head["S=32: RSS growth per row written, cow over memr1"]
    assert np.isclose(grow["value"], 0.5) and grow["target"] == 1.0 and grow["met"] is False
    assert (grow["ours_kb_per_row"], grow["baseline_kb_per_row"]) == (2.0, 1.0)
    assert np.isclose(head["S=32: RSS growth per row written, deepcopy over memr1"]["value"], 16.0)
    # at another S no targets; memr1 growing by less than a page gives no ratio
    other = headline({**mine, "memr1": row(0.4, 0.004, 0.001)}, 8)
    assert all(h["target"] is None for h in other)
    assert [h["value"] for h in other if h["name"].startswith("S=8: RSS")] == [None] * 3


def test_with_generation_projects_each_impls_snapshot_share_of_the_step():
    mine = {"memr1": row(0.4, 0.128, 1.0), "pickle_snapshots": row(2.0, 12.8, 4.0), "deepcopy": row(0.8, 1.28, 16.0),
            "cow_numpy": row(0.5, 0.256, 0.5)}   # 1, 100, 10, 2 ms per snapshot or restore
    head = with_generation({"forks": 10, "step_s": 1.0}, mine, 32)
    assert [h["baseline"] for h in head] == ["pickle_snapshots S=32", "deepcopy S=32", "cow_numpy S=32"]
    assert all(np.isclose(h["value"], 0.01) and h["unit"] == "share" and h["better"] == "lower" for h in head)
    assert np.isclose(head[0]["baseline_share"], 1.0 / 1.99) and np.isclose(head[2]["baseline_share"], 0.02 / 1.01)
