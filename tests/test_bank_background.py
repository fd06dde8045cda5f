"""Background compaction (BankConfig.auto_compact_background, memory_store/compaction.py): ops and
searches go on against the old generation while the new one is built; the ops applied meanwhile are
replayed onto it, so nothing is lost whether the bank commits, closes, compacts again, fails or exits;
and the pieces it is built from (State.rebased, sliced reads, sliced encoding) equal the plain ones."""
import errno
import os
import subprocess
import sys
import threading

import msgspec
import numpy as np
import pytest

from bank_model import ModelBank, assert_same, model_after, op_stream
from memr1.memory_store import Add, BankError, Delete, InvalidInput, MemoryBank, Noop, Update, compaction
from memr1.memory_store.schema import FORMAT, VERSION, Manifest, Memory, apply_op
from memr1.memory_store.segment import RowIndex, memory_segment, state_over
from memr1.memory_store.segment_io import CarriedVectors, encode_memories, write_vectors

DIM = 16
QUERIES = np.random.default_rng(11).standard_normal((6, DIM)).astype(np.float32)


def make_bank(tmp_path, layout, **overrides):
    path = tmp_path / "b" if layout == "disk" else None
    return MemoryBank.create(path, dim=DIM, auto_compact_min_rows=50, auto_compact_ratio=0.1, fsync="never",
                             hnsw_threshold=40, **overrides)


def apply_all(bank, model, ops, batch_every=0):
    """Apply ops one by one, every `batch_every`-th chunk of 5 as one apply_batch."""
    i = 0
    while i < len(ops):
        if batch_every and (i // 5) % batch_every == batch_every - 1:
            bank.apply_batch(ops[i:i + 5])
            for op in ops[i:i + 5]:
                model.apply(op)
            i += 5
        else:
            bank.apply(ops[i])
            model.apply(ops[i])
            i += 1


@pytest.mark.parametrize("layout", ["disk", "memory"])
def test_ops_and_searches_go_on_while_a_build_waits(tmp_path, gate, layout):
    ops, model = op_stream(7, 600), ModelBank()
    bank = make_bank(tmp_path, layout)
    apply_all(bank, model, ops[:300], batch_every=4)
    assert bank.compacting and bank.compactions == 0  # the op past 50 dirty rows started a build
    assert_same(bank, model, QUERIES)  # every op since is searchable in the old generation
    fork = bank.fork()
    gate.set()
    bank.wait_for_compaction()
    assert not bank.compacting and bank.compactions >= 1 and bank.stats()["base_rows"] > 0
    assert_same(bank, model, QUERIES)  # the 250 ops that came during the build were replayed onto it
    assert_same(fork, model_after(ops, 300), QUERIES)  # a fork taken before the commit keeps its view
    apply_all(bank, model, ops[300:], batch_every=3)
    bank.wait_for_compaction()
    assert_same(bank, model, QUERIES)
    bank.close()
    if layout == "disk":
        again = MemoryBank.open(tmp_path / "b", "r")
        assert again.stats()["ops"] == len(ops)
        assert_same(again, model, QUERIES)


def test_ops_that_land_after_the_first_replay_are_replayed_under_the_lock(tmp_path, monkeypatch):
    """The build replays the ops recorded so far without the lock; ops that land after that (here: from
    inside that replay) must be replayed under the lock before the commit."""
    ops, real, late = op_stream(14, 300), compaction.replay, []

    def replay_then_more_ops(core, records, where, sink=None):
        real(core, records, where, sink)
        if not late:  # the first replay: the ops recorded before it
            late.extend(ops[bank.stats()["ops"]:][:20])
            for op in late:
                bank.apply(op)
    monkeypatch.setattr(compaction, "replay", replay_then_more_ops)
    bank = make_bank(tmp_path, "disk")
    i = 0
    while not bank.compacting:
        bank.apply(ops[i])
        i += 1
    bank.wait_for_compaction()
    assert late and bank.compactions >= 1
    applied = ops[:i] + late
    assert_same(bank, model_after(applied, len(applied)), QUERIES)
    bank.close()
    assert_same(MemoryBank.open(tmp_path / "b", "r"), model_after(applied, len(applied)), QUERIES)


def mid_build(tmp_path, layout, seed, gate):
    """A bank whose 200 ops started a build held at the gate, which opens 0.2 s from now."""
    ops = op_stream(seed, 200)
    bank = make_bank(tmp_path, layout)
    for op in ops:
        bank.apply(op)
    assert bank.compacting
    threading.Timer(0.2, gate.set).start()
    return bank, ops


def test_close_commits_a_build_in_flight(tmp_path, gate):
    bank, ops = mid_build(tmp_path, "disk", 8, gate)
    bank.close()  # waits for the build, which commits (and for the next, if the ops meanwhile were many)
    gen = bank._manifest.generation
    assert bank.compactions == gen >= 1
    names = sorted(p.name for p in (tmp_path / "b").iterdir() if p.name.startswith(("base-", "log-")))
    assert names == [f"base-{gen}", f"log-{gen}.oplog"]
    again = MemoryBank.open(tmp_path / "b", "r")
    assert again.stats()["ops"] == len(ops)
    assert_same(again, model_after(ops, len(ops)), QUERIES)


def test_compact_finishes_the_build_then_empties_the_delta(tmp_path, gate):
    bank, ops = mid_build(tmp_path, "memory", 9, gate)
    bank.compact()
    s = bank.stats()
    assert bank.compactions >= 2 and s["delta_rows"] == s["base_dead"] == 0
    assert_same(bank, model_after(ops, len(ops)), QUERIES)


@pytest.mark.parametrize("layout", ["disk", "memory"])
def test_a_build_that_fails_is_raised_by_the_next_write_and_nothing_is_lost(tmp_path, monkeypatch, layout):
    def broken(*args):
        raise ValueError("a bug in the build")
    monkeypatch.setattr(compaction, "build", broken)
    ops = op_stream(10, 400)
    bank = make_bank(tmp_path, layout)
    i = 0
    while not bank.compacting:
        bank.apply(ops[i])
        i += 1
    bank.wait_for_compaction()
    with pytest.raises(BankError, match="automatic compaction .* failed: ValueError"):
        bank.apply(ops[i])
    assert bank.stats()["ops"] == i and bank.compactions == 0  # the write that reported it was not applied
    monkeypatch.undo()
    for op in ops[i:]:
        bank.apply(op)
    bank.wait_for_compaction()
    assert_same(bank, model_after(ops, len(ops)), QUERIES)
    bank.close()
    if layout == "disk":
        assert_same(MemoryBank.open(tmp_path / "b", "r"), model_after(ops, len(ops)), QUERIES)


def test_a_process_that_exits_during_a_build_loses_nothing(tmp_path):
    """The build thread is not a daemon: the interpreter waits for it at exit, and it commits."""
    script = f"""
import numpy as np
from memr1.memory_store import Add, MemoryBank
rng = np.random.default_rng(0)
n = 20000
bank = MemoryBank.from_arrays({str(tmp_path / 'b')!r}, rng.standard_normal((n, 64)).astype(np.float32),
                              ["m"] * n, ["A"] * n, ["t"] * n, auto_compact_min_rows=100, auto_compact_ratio=0.001)
for i in range(101):
    bank.apply(Add(f"new {{i}}", rng.standard_normal(64).astype(np.float32), "A"))
assert bank.compacting
print("exiting")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "exiting" in out.stdout, out.stderr[-2000:]
    bank = MemoryBank.open(tmp_path / "b", "r")
    assert bank._manifest.generation == 1 and len(bank) == 20101 and bank.stats()["ops"] == 20101


def test_rebased_state_equals_the_state_read_back_from_its_segment():
    ops = op_stream(12, 400)
    bank = MemoryBank.create(None, dim=DIM, auto_compact_ratio=0.0)
    for op in ops[:300]:
        bank.apply(op)
    bank.compact()  # a base with rows, then dead rows and a delta on top
    for op in ops[300:]:
        bank.apply(op)
    snap = bank._core.fork()
    memories, vectors, _ = compaction.live_rows(snap)
    segment = memory_segment(vectors, memories, bank.config)
    rebased = snap.rebased(segment.vectors)
    read_back = state_over(bank.config, segment, Manifest(FORMAT, VERSION, bank.config, 1, snap.next_id, snap.lsn,
                                                          len(memories), 1))
    ids = [m.id for m in memories]
    v = np.random.default_rng(3).standard_normal((4, DIM)).astype(np.float32)
    more = [Update(ids[0], "changed", v[0], sources=("D9:1",)), Delete(ids[1]), Add("new", v[1], "B", "t2"),
            Update(ids[-1], "changed too", v[2], "t3"), Noop()]
    for then in ([], more):  # as built, then after the same ops on both
        for op in then:
            assert apply_op(rebased, None, op) == apply_op(read_back, None, op)
        for attr in ("size", "next_id", "lsn", "base_size", "delta_len", "base_dead"):
            assert getattr(rebased, attr) == getattr(read_back, attr), attr
        assert rebased.live() == read_back.live()
        for q in QUERIES:
            a, b = rebased.search(q, 10), read_back.search(q, 10)
            assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()
    with pytest.raises(InvalidInput, match="shape"):
        snap.rebased(np.zeros((1, DIM), np.float32))


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 100, 65535, 65536, 70001])
def test_sliced_encoding_and_reads_equal_the_plain_ones(n):
    memories = [Memory(i, f"text {i}", "A", "t", i, i, None if i % 3 else f"old {i}", ("D1:2",) * (i % 2))
                for i in range(n)]
    for rows_per_call in (7, 16, 8192):
        assert encode_memories(memories, rows_per_call) == msgspec.msgpack.encode(memories)
    if n <= 100:
        bank = MemoryBank.create(None, dim=DIM)
        for m in memories:
            bank.apply(Add(m.text, np.ones(DIM, np.float32), m.speaker, m.timestamp, m.sources))
        core = bank._core
        whole, rows = core.live(), core.live_rows()
        assert len(rows) == n and [r for s in range(0, n, 7) for r in rows.slice(s, s + 7)] == whole
        assert rows.slice(5, 3) == [] and rows.slice(n + 4, n + 9) == [] and rows.slice(-3, 2) == whole[:2]
        assert compaction.live_rows(core)[0] == [Memory(*r) for r in whole]
        bank.apply(Add("after the snapshot", np.ones(DIM, np.float32), "A"))  # the rows are a snapshot
        assert rows.slice(0, n + 1) == whole and rows.vectors().shape == (n, DIM)


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_a_base_carried_over_equals_one_written_whole(tmp_path, monkeypatch, kernel_copy):
    """A compaction on disk reuses the base's Memory objects for the rows it still holds and copies their
    vectors file to file (CarriedVectors); the new base must equal one made from the live rows alone,
    byte for byte, whether the kernel copies (copy_file_range) or a buffer does."""
    if not kernel_copy:
        def refused(*args):
            raise OSError(errno.EXDEV, "cross-device")
        monkeypatch.setattr(os, "copy_file_range", refused, raising=False)
    ops = op_stream(13, 500)
    bank = MemoryBank.create(tmp_path / "b", dim=DIM, auto_compact_ratio=0.0, fsync="never", hnsw_threshold=40)
    for op in ops[:300]:
        bank.apply(op)
    bank.compact()  # a base of rows on disk, then updates, deletes and adds over it
    for op in ops[300:]:
        bank.apply(op)
    snap = bank._core.fork()
    plain, whole, _ = compaction.live_rows(snap)
    base_file = tmp_path / "b" / f"base-{bank._manifest.generation}" / "vectors.f32"
    reused, carried, index = compaction.live_rows(snap, bank._segment, base_file)
    assert reused == plain and isinstance(carried, CarriedVectors)
    # the RowIndex made from native columns is the one the Memory objects give
    want = RowIndex.of_memories(plain)
    assert sorted(index.by_speaker) == sorted(want.by_speaker) and len(want.by_speaker) > 1
    assert all(np.array_equal(index.by_speaker[s], rows) and rows.dtype == index.by_speaker[s].dtype
               for s, rows in want.by_speaker.items())
    assert np.array_equal(index.ids, want.ids) and np.array_equal(index.updated, want.updated)
    assert (carried.rows >= 0).sum() > 30 and (carried.rows < 0).sum() > 30  # both kinds of rows
    assert all(m is bank._segment.memories[r] for m, r in zip(reused, carried.rows.tolist()) if r >= 0)
    written = write_vectors(tmp_path / "carried.f32", carried, len(plain), DIM)
    assert (tmp_path / "carried.f32").read_bytes() == whole.tobytes() and np.array_equal(written, whole)
    bank.compact()
    assert (tmp_path / "b" / f"base-{bank._manifest.generation}" / "vectors.f32").read_bytes() == whole.tobytes()
    model = model_after(ops, len(ops))
    assert_same(bank, model, QUERIES)
    bank.close()
    assert_same(MemoryBank.open(tmp_path / "b", "r"), model, QUERIES)
