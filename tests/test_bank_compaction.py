"""Automatic compaction (BankConfig.auto_compact_ratio / auto_compact_min_rows): when it triggers, that
searches stay right across it, that forks never compact, and that every op survives it (reopen, SIGKILL)."""
import random

import numpy as np
import pytest

from bank_crash import kill_and_recover
from bank_model import ModelBank, assert_same, model_after, op_stream
from memr1.memory_store import Add, Delete, MemoryBank, Noop, Update

DIM = 16


def vecs(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def dirty(bank):
    s = bank.stats()
    return s["delta_rows"] + s["base_dead"]


@pytest.mark.parametrize("background", [False, True])
def test_triggers_past_the_floor_and_not_before(background):
    bank = MemoryBank.create(None, dim=DIM, auto_compact_min_rows=100, auto_compact_ratio=0.5,
                             auto_compact_background=background)
    v = vecs(300)
    assert bank.auto_compact_at == 100  # no base yet: the floor
    for i in range(100):
        bank.apply(Add(f"m{i}", v[i], "A"))
    bank.wait_for_compaction()
    assert bank.compactions == 0 and dirty(bank) == 100
    bank.apply(Add("one more", v[100], "A"))
    bank.wait_for_compaction()
    assert bank.compactions == 1
    assert bank.stats()["base_rows"] == 101 and dirty(bank) == 0
    assert bank.auto_compact_at == 100  # 0.5 x 101 is under the floor


@pytest.mark.parametrize("background", [False, True])
def test_each_count_triggers_past_its_ratio_of_the_base_and_not_before(tmp_path, background):
    """Delta rows (scanned by every search) and dead base rows (skipped) have their own thresholds; an
    update of a base row adds one to each."""
    n = 1000
    bank = MemoryBank.from_arrays(tmp_path / "b", vecs(n), [f"m{i}" for i in range(n)], ["A"] * n, ["t"] * n,
                                  auto_compact_min_rows=100, auto_compact_ratio=0.5, auto_compact_dead_ratio=0.2,
                                  auto_compact_background=background)
    assert (bank.auto_compact_at, bank.auto_compact_dead_at) == (500, 200)

    def settled(compactions, delta, dead):
        bank.wait_for_compaction()
        s = bank.stats()
        assert (bank.compactions, s["delta_rows"], s["base_dead"]) == (compactions, delta, dead)
    for i in range(200):
        bank.apply(Delete(i))
    bank.apply(Noop())
    settled(0, 0, 200)
    bank.apply(Delete(200))
    settled(1, 0, 0)
    assert bank.stats()["base_rows"] == n - 201 and (bank.auto_compact_at, bank.auto_compact_dead_at) == (399, 159)
    v = vecs(600, seed=1)
    for i in range(399):
        bank.apply(Add(f"a{i}", v[i], "A"))
    settled(1, 399, 0)
    bank.apply(Add("one more", v[399], "A"))
    settled(2, 0, 0)
    assert bank.stats()["base_rows"] == 1199 and (bank.auto_compact_at, bank.auto_compact_dead_at) == (599, 239)
    for i in range(239):
        bank.apply(Update(300 + i, f"u{i}", v[i]))
    settled(2, 239, 239)
    bank.apply(Update(299, "the dead count crosses first", v[0]))
    settled(3, 0, 0)
    # apply_batch checks once, after the whole batch
    bank.apply_batch([Delete(600 + i) for i in range(239)] + [Noop()])
    settled(3, 0, 239)
    bank.apply_batch([Delete(900), Delete(901)])
    settled(4, 0, 0)
    bank.close()


def test_a_refused_compaction_backs_off_only_the_count_that_crossed(tmp_path, monkeypatch):
    import errno
    from memr1.memory_store import BankIOError, compaction

    def full_disk(*args):
        raise BankIOError("cannot write generation 1: No space left on device; the bank is unchanged", errno.ENOSPC)
    n = 100
    bank = MemoryBank.from_arrays(tmp_path / "b", vecs(n), [f"m{i}" for i in range(n)], ["A"] * n, ["t"] * n,
                                  auto_compact_min_rows=20, auto_compact_ratio=0.1, auto_compact_dead_ratio=0.3,
                                  auto_compact_background=False)
    assert (bank.auto_compact_at, bank.auto_compact_dead_at) == (20, 30)
    monkeypatch.setattr(compaction, "prepare_generation", full_disk)
    with pytest.warns(RuntimeWarning, match="No space left"):
        for i in range(31):
            bank.apply(Delete(i))
    assert bank.compactions == 0 and (bank.auto_compact_at, bank.auto_compact_dead_at) == (20, 62)
    bank.close()


def test_ratio_zero_turns_it_off_and_readers_never_compact(tmp_path):
    bank = MemoryBank.create(tmp_path / "b", dim=DIM, auto_compact_ratio=0.0, auto_compact_min_rows=1)
    assert bank.auto_compact_at is None
    for i, v in enumerate(vecs(50)):
        bank.apply(Add(f"m{i}", v, "A"))
    assert bank.compactions == 0 and bank.stats()["delta_rows"] == 50
    bank.close()
    reader = MemoryBank.open(tmp_path / "b", "r")
    assert reader.auto_compact_at is None


@pytest.mark.parametrize("background", [False, True])
def test_a_refused_compaction_warns_keeps_the_op_and_backs_off(tmp_path, monkeypatch, background):
    import errno
    from memr1.memory_store import BankIOError, compaction

    def full_disk(*args):
        raise BankIOError("cannot write generation 1: No space left on device; the bank is unchanged", errno.ENOSPC)
    bank = MemoryBank.create(tmp_path / "b", dim=DIM, auto_compact_min_rows=20, auto_compact_ratio=0.1,
                             auto_compact_background=background)
    v = vecs(60)
    for i in range(20):
        bank.apply(Add(f"m{i}", v[i], "A"))
    monkeypatch.setattr(compaction, "prepare_generation", full_disk)
    with pytest.warns(RuntimeWarning, match="No space left"):
        assert bank.apply(Add("crossing", v[20], "A")) == 20  # the op itself stands
        if background:  # the thread's failure is reported by the next write
            bank.wait_for_compaction()
            bank.apply(Noop())
    assert bank.compactions == 0 and len(bank) == 21 and bank.auto_compact_at == 42
    assert not any(p.name.startswith(("base-1", "log-1")) for p in (tmp_path / "b").iterdir())
    monkeypatch.undo()
    for i in range(21, 42):
        bank.apply(Add(f"m{i}", v[i], "A"))
    bank.wait_for_compaction()
    assert bank.compactions == 0
    bank.apply(Add("past the doubled threshold", v[42], "A"))
    bank.wait_for_compaction()
    assert bank.compactions == 1 and bank.auto_compact_at == 20
    bank.close()
    ops = ([Add(f"m{i}", v[i], "A") for i in range(20)] + [Add("crossing", v[20], "A")] + [Noop()] * background +
           [Add(f"m{i}", v[i], "A") for i in range(21, 42)] + [Add("past the doubled threshold", v[42], "A")])
    assert_same(MemoryBank.open(tmp_path / "b", "r"), model_after(ops, len(ops)))


def test_a_fork_never_compacts():
    bank = MemoryBank.create(None, dim=DIM, auto_compact_min_rows=10, auto_compact_ratio=0.1)
    v = vecs(200)
    for i in range(10):
        bank.apply(Add(f"m{i}", v[i], "A"))
    fork = bank.fork()
    assert fork.auto_compact_at is None
    for i in range(10, 200):
        fork.apply(Add(f"m{i}", v[i], "A"))
    fork.apply_batch([Update(i, "u", v[i + 1]) for i in range(50)])
    assert fork.compactions == 0 and fork.stats()["base_rows"] == 0 and fork.stats()["delta_rows"] == 250
    assert len(bank) == 10 and bank.compactions == 0  # the parent saw none of it
    fork.compact()  # an explicit compaction of a fork is still allowed
    assert fork.compactions == 1 and len(fork) == 200


@pytest.mark.parametrize("background", [False, True])
@pytest.mark.parametrize("hnsw", [False, True])
def test_search_matches_brute_force_across_auto_compactions(tmp_path, hnsw, background):
    """In the background mode the checks also run while compactions are in flight."""
    ops = op_stream(3, 1500)
    bank = MemoryBank.create(tmp_path / "b", dim=DIM, auto_compact_min_rows=60, auto_compact_ratio=0.2,
                             hnsw_threshold=50 if hnsw else 10**6, fsync="never", auto_compact_background=background)
    model, queries, graphs = ModelBank(), vecs(8, seed=9), 0
    found, top10, asked = 0, 0, 0
    for i, op in enumerate(ops):
        bank.apply(op)
        model.apply(op)
        if i % 150 == 149:
            assert_same(bank, model, queries)  # exact search against the model's float64 ranking
            bank.wait_for_compaction()
            if bank.stats()["hnsw_speakers"]:
                graphs += 1
                for q in queries:  # the graph's top-10 against the true top-10
                    top10 += len(set(model.search(q, 10)) & set(bank.search(q, 10).ids.tolist()))
                live = [j for j in model.rows if j % 7 == 0][:20]
                for j in live:  # a live row's own vector finds it, whatever base it now lives in
                    found += bank.search(model.rows[j]["vector"], 1).ids.tolist() == [j]
                asked += len(live)
    assert bank.compactions >= 5 and (graphs >= 5 if hnsw else graphs == 0)
    # usearch's multi-threaded graph build leaves the odd node unreachable, so graph search is
    # near-perfect, not perfect; candidates from the wrong base or a missed dead row would be far off.
    assert top10 >= 0.95 * 10 * len(queries) * graphs and found >= 0.95 * asked
    bank.close()


@pytest.mark.parametrize("background", [False, True])
def test_reopen_after_auto_compactions_sees_every_op(tmp_path, background):
    ops = op_stream(4, 900)
    bank = MemoryBank.create(tmp_path / "b", dim=DIM, auto_compact_min_rows=50, auto_compact_ratio=0.1,
                             auto_compact_background=background)
    for i, op in enumerate(ops[:-20]):
        bank.apply(op)
        if i % 100 == 99:
            bank.wait_for_compaction()
    bank.wait_for_compaction()
    for op in ops[-20:]:  # under the threshold: these stay in the log
        bank.apply(op)
    assert bank.compactions >= 3 and dirty(bank) > 0  # some ops after the last compaction, in the log
    bank.close()
    model = model_after(ops, len(ops))
    for mode in ("r", "rw"):
        again = MemoryBank.open(tmp_path / "b", mode)
        assert again.stats()["ops"] == len(ops)
        assert_same(again, model, vecs(4, seed=5))
        again.close()
    generations = sorted(p.name for p in (tmp_path / "b").iterdir() if p.name.startswith("base-"))
    assert len(generations) == 1  # older generations were removed as they were replaced


@pytest.mark.parametrize("background", [False, True])
@pytest.mark.parametrize("trial", range(6))
def test_sigkill_during_auto_compactions_recovers_a_prefix(tmp_path, trial, background):
    ops = op_stream(100 + trial, 3000)
    path = str(tmp_path / "bank")
    MemoryBank.create(path, dim=DIM, hnsw_threshold=10**6, auto_compact_min_rows=60, auto_compact_ratio=0.1,
                      auto_compact_background=background).close()
    # compact_every=10**9: only automatic compactions
    kill_and_recover(path, ops, "never", 10**9, random.Random(trial).uniform(0.02, 0.3)).close()
