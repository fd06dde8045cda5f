"""Crash and corruption: a SIGKILL at any instant recovers exactly a prefix of the applied ops; a torn
tail is dropped; a corrupted record in the middle is an error that names its offset."""
import os
import random

import pytest

from bank_crash import kill_and_recover
from bank_model import assert_same, model_after, op_stream
from memr1.memory_store import CorruptLog, MemoryBank, Noop

DIM = 16


@pytest.mark.parametrize("trial", range(32))
def test_sigkill_recovers_a_prefix(tmp_path, trial):
    # Both policies survive a killed process. Without fsync ops take microseconds, so that stream is
    # longer and the kill comes sooner; both land inside compactions too.
    fsync = "op" if trial % 2 == 0 else "never"
    n_ops, compact_every, max_wait = (400, 97, 0.25) if fsync == "op" else (3000, 997, 0.06)
    ops = op_stream(trial, n_ops)
    path = str(tmp_path / "bank")
    MemoryBank.create(path, dim=DIM, hnsw_threshold=10**6).close()
    bank = kill_and_recover(path, ops, fsync, compact_every, random.Random(1000 + trial).uniform(0.0, max_wait))
    bank.apply(Noop())  # the recovered bank takes new writes
    bank.close()


def write_bank(path, n_ops: int = 60):
    ops = op_stream(7, n_ops)
    bank = MemoryBank.create(path, dim=DIM)
    for op in ops:
        bank.apply(op)
    bank.close()
    return ops


def frame_offsets(log_path) -> list[int]:
    data = open(log_path, "rb").read()
    offsets, off = [], 32
    while off + 8 <= len(data):
        n = int.from_bytes(data[off:off + 4], "little")
        if n == 0:
            break
        offsets.append(off)
        off += 8 + (n + 7) // 8 * 8
    return offsets


def test_flipped_byte_in_the_middle_names_its_offset(tmp_path):
    write_bank(tmp_path / "b")
    log = tmp_path / "b" / "log-0.oplog"
    offsets = frame_offsets(log)
    victim = offsets[len(offsets) // 2]
    data = bytearray(log.read_bytes())
    data[victim + 8 + 3] ^= 0x40  # a payload byte of a middle record
    log.write_bytes(bytes(data))
    with pytest.raises(CorruptLog) as err:
        MemoryBank.open(tmp_path / "b")
    assert err.value.offset == victim
    assert f"offset {victim}" in str(err.value)


def test_flipped_length_byte_is_not_mistaken_for_a_torn_tail(tmp_path):
    write_bank(tmp_path / "b")
    log = tmp_path / "b" / "log-0.oplog"
    victim = frame_offsets(log)[10]
    data = bytearray(log.read_bytes())
    data[victim + 1] ^= 0x7F  # the record's length now points far away
    log.write_bytes(bytes(data))
    with pytest.raises(CorruptLog) as err:
        MemoryBank.open(tmp_path / "b", "r")
    assert err.value.offset == victim


def test_truncated_tail_drops_only_the_last_record(tmp_path):
    ops = write_bank(tmp_path / "b")
    log = tmp_path / "b" / "log-0.oplog"
    last = frame_offsets(log)[-1]
    size = log.stat().st_size
    os.truncate(log, last + (size - last) // 2)  # cut the last record in half
    with pytest.warns(RuntimeWarning, match="torn"):  # a committed record lost: reported, not silent
        bank = MemoryBank.open(tmp_path / "b")
    assert bank.stats()["ops"] == len(ops) - 1
    assert_same(bank, model_after(ops, len(ops) - 1))
    bank.apply(ops[-1])  # the dropped op can be applied again on top
    bank.close()
    bank = MemoryBank.open(tmp_path / "b", "r")
    assert_same(bank, model_after(ops, len(ops)))
