"""The bank's files: a damaged MANIFEST.json or last op-log record is an error, never a silently
different bank; nothing is written through a symlink under the bank folder; a FIFO is refused, not
waited on; a bad path is a BankError."""
import errno
import json
import os
import pathlib
import re
import signal
import warnings
from contextlib import contextmanager

import numpy as np
import pytest

from bank_model import op_stream
from memr1.memory_store import (Add, BankError, BankFormatError, BankIOError, CorruptLog, InvalidInput,
                                MemoryBank)
from memr1.memory_store.manifest import read_manifest

DIM = 16


def snapshot(bank) -> tuple:
    return bank.stats(), list(bank)


def write_bank(path, n_ops=20):
    """A bank with a base segment (4 rows, ops 0-3) and `n_ops` logged ops."""
    vectors = np.random.default_rng(0).standard_normal((4, DIM)).astype(np.float32)
    MemoryBank.from_arrays(path, vectors, ["a", "b", "c", "d"], ["A"] * 4, ["t"] * 4).close()
    bank = MemoryBank.open(path)
    for op in op_stream(1, n_ops):
        bank.apply(op)
    bank.close()


def test_every_single_bit_flip_of_the_manifest_is_refused_or_harmless(tmp_path):
    path = tmp_path / "b"
    write_bank(path)
    want = snapshot(MemoryBank.open(path, "r"))
    manifest = path / "MANIFEST.json"
    data = manifest.read_bytes()
    differ = []
    for bit in range(len(data) * 8):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        manifest.write_bytes(bytes(flipped))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = snapshot(MemoryBank.open(path, "r"))
        except BankError:
            continue
        if got != want:
            differ.append(bit)
    assert not differ, f"{len(differ)} flips open as a different bank, e.g. bit {differ[0]}"


def test_manifest_without_a_checksum_is_refused(tmp_path):
    path = tmp_path / "b"
    write_bank(path)
    manifest = path / "MANIFEST.json"
    raw = json.loads(manifest.read_bytes())
    del raw["checksum"]
    manifest.write_text(json.dumps(raw))
    for mode in ("r", "rw"):
        with pytest.raises(BankFormatError, match="carries no checksum"):
            MemoryBank.open(path, mode)


def last_frame(log) -> tuple[int, int]:
    data, off, last = log.read_bytes(), 32, None
    while off + 8 <= len(data) and (n := int.from_bytes(data[off:off + 4], "little")):
        last, off = (off, n), off + 8 + (n + 7) // 8 * 8
    return last


def bank_with_its_last_record(tmp_path):
    """A written bank's folder, its op log's path and bytes, and (offset, length) of its last record."""
    path = tmp_path / "b"
    write_bank(path)
    log = path / "log-0.oplog"
    return path, log, log.read_bytes(), last_frame(log)


def test_every_single_bit_flip_of_the_last_log_record_is_reported(tmp_path):
    path, log, data, (off, n) = bank_with_its_last_record(tmp_path)
    silent = []
    for bit in range(off * 8, (off + 8 + n) * 8):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        log.write_bytes(bytes(flipped))
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                bank = MemoryBank.open(path, "r")
        except CorruptLog:
            continue
        if bank.stats()["ops"] != 24 and not any("torn" in str(w.message) for w in seen):
            silent.append(bit - off * 8)
    assert not silent, f"{len(silent)} flips of the last record drop it silently, e.g. bit {silent[0]}"


def test_torn_and_uncommitted_last_records(tmp_path):
    path, log, data, (off, n) = bank_with_its_last_record(tmp_path)
    # An append killed before its header was stored committed nothing: dropped without a word.
    uncommitted = bytearray(data)
    uncommitted[off:off + 8] = bytes(8)
    log.write_bytes(bytes(uncommitted))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert MemoryBank.open(path, "r").stats()["ops"] == 23
    # A power loss that lost the page holding the record's end: dropped, and reported.
    page = (off + 8 + n - 1) // 4096 * 4096
    torn = bytearray(data)
    torn[max(page, off + 8):] = bytes(len(torn) - max(page, off + 8))
    log.write_bytes(bytes(torn))
    with pytest.warns(RuntimeWarning, match="torn"):
        assert MemoryBank.open(path, "r").stats()["ops"] == 23


@contextmanager
def no_hang(seconds=20):
    def hung(*_):
        raise TimeoutError("the bank waited on a FIFO")
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("name, when", [("LOCK", "open"), ("log-0.oplog", "open"), ("MANIFEST.json.tmp", "compact")])
def test_no_write_through_a_symlink(tmp_path, name, when):
    path, outside = tmp_path / "b", tmp_path / "outside"
    write_bank(path)
    outside.write_bytes(b"keep")

    def plant():
        target = path / name
        if target.exists():
            os.replace(target, tmp_path / "moved")
        os.symlink(outside, target)

    try:
        if when == "open":
            plant()
        bank = MemoryBank.open(path)
        bank.apply(Add("m", np.ones(DIM, np.float32), "A"))
        if when == "compact":
            plant()
        bank.compact()
        bank.close()
    except BankFormatError as e:
        assert "symlink" in str(e) or "regular file" in str(e)
    assert outside.read_bytes() == b"keep"


@pytest.mark.parametrize("name", ["LOCK", "log-0.oplog", "base-0/records.msgpack", "base-0/vectors.f32"])
def test_fifo_is_refused_not_waited_on(tmp_path, name):
    path = tmp_path / "b"
    write_bank(path)
    target = path / name
    target.unlink(missing_ok=True)
    os.mkfifo(target)
    for mode in ("rw", "r"):
        with no_hang(), pytest.raises(BankFormatError, match="regular file"):
            MemoryBank.open(path, mode).close()
        if name == "LOCK":
            break


def test_bad_paths_are_bank_errors(tmp_path):
    with pytest.raises(InvalidInput, match="NUL"):
        MemoryBank.create(str(tmp_path / "a\0b"), dim=DIM)
    with pytest.raises(InvalidInput, match="NUL"):
        MemoryBank.open(str(tmp_path / "a\0b"))
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(BankIOError, match=re.escape(str(tmp_path / "file" / "b"))):
        MemoryBank.create(tmp_path / "file" / "b", dim=DIM)


def test_log_ops_from_before_the_bounds_still_replay(tmp_path):
    # Logs written before the speaker, timestamp and norm bounds may hold ops past them; such a bank
    # must still open (new ops are bounded, logged ones are not re-judged).
    from memr1.memory_store import _core
    path = tmp_path / "b"
    MemoryBank.create(path, dim=DIM).close()
    log = _core.OpLog(str(path / "log-0.oplog"), True, 0, 1, 0, read_manifest(path).bank_id)
    state = _core.State(DIM, 4096)
    big = np.full(DIM, 1e12, np.float32)
    state.add(log, "m", "s" * 5000, "t" * 1000, big, replay=True)  # as the code before the bounds logged it
    log.close()
    bank = MemoryBank.open(path)
    assert (len(bank.get(0).speaker), len(bank.get(0).timestamp)) == (5000, 1000)
    with pytest.raises(InvalidInput, match="outside"):
        bank.apply(Add("m", big, "A"))
    bank.close()


def test_read_only_file_system_is_a_bank_io_error(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    monkeypatch.setattr(pathlib.Path, "mkdir", refuse)
    with pytest.raises(BankIOError, match="Read-only file system") as err:
        MemoryBank.create(tmp_path / "b", dim=DIM)
    assert err.value.errno == errno.EROFS
