"""Every bad input gets its own clear error, and the bank is unchanged after it."""
import json
import subprocess
import sys

import numpy as np
import pytest

from memr1.memory_store import (Add, BankError, BankFormatError, BankLocked, Delete, InvalidInput, MemoryBank, Noop,
                                ReadOnlyBank, UnknownMemoryId, Update)
from memr1.memory_store.manifest import seal

DIM = 8


def vec(seed=0):
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)


@pytest.fixture
def bank(tmp_path):
    b = MemoryBank.create(tmp_path / "b", dim=DIM, max_text_bytes=64)
    for i in range(3):
        b.apply(Add(f"fact {i}", vec(i), "A", "t"))
    b.apply(Delete(2))
    yield b
    b.close()


def snapshot(b):
    return list(b), b.stats()


def expect(bank, op, exc, *fragments):
    before = snapshot(bank)
    with pytest.raises(exc) as err:
        bank.apply(op)
    for f in fragments:
        assert f in str(err.value), f"{f!r} not in {err.value}"
    assert snapshot(bank) == before, "a rejected op changed the bank"
    return err.value


def test_update_of_unknown_id(bank):
    e = expect(bank, Update(17, "x", vec()), UnknownMemoryId, "17")
    assert e.memory_id == 17 and isinstance(e, KeyError)


def test_update_and_delete_of_deleted_id(bank):
    expect(bank, Update(2, "x", vec()), UnknownMemoryId, "2")
    expect(bank, Delete(2), UnknownMemoryId, "2")


def test_delete_of_negative_id(bank):
    expect(bank, Delete(-1), UnknownMemoryId, "-1")


def test_vector_wrong_dim(bank):
    expect(bank, Add("x", np.zeros(DIM + 1, np.float32) + 1, "A"), InvalidInput, "shape", f"({DIM},)")


def test_vector_wrong_dtype(bank):
    expect(bank, Add("x", vec().astype(np.float64), "A"), InvalidInput, "float64", "float32")


def test_vector_not_an_array(bank):
    expect(bank, Update(0, "x", [1.0] * DIM), InvalidInput, "numpy float32 array", "list")


def test_vector_with_nan(bank):
    v = vec()
    v[3] = np.nan
    expect(bank, Add("x", v, "A"), InvalidInput, "non-finite", "index 3")


def test_vector_with_inf(bank):
    v = vec()
    v[5] = np.inf
    expect(bank, Update(0, "x", v), InvalidInput, "non-finite", "index 5")


def test_vector_all_zero(bank):
    expect(bank, Add("x", np.zeros(DIM, np.float32), "A"), InvalidInput, "zeros")


def test_empty_text(bank):
    expect(bank, Add("", vec(), "A"), InvalidInput, "empty")
    expect(bank, Update(0, "", vec()), InvalidInput, "empty")


def test_text_over_limit(bank):
    expect(bank, Add("x" * 65, vec(), "A"), InvalidInput, "65 bytes", "64")


def test_not_an_op(bank):
    expect(bank, "ADD something", InvalidInput, "not a bank operation", "str")


def test_batch_is_all_or_nothing(bank):
    before = snapshot(bank)
    with pytest.raises(UnknownMemoryId) as err:
        bank.apply_batch([Add("new", vec(9), "A"), Delete(0), Update(0, "again", vec())])
    assert "op 2" in "".join(getattr(err.value, "__notes__", []))
    assert snapshot(bank) == before
    bank.close()
    reopened = MemoryBank.open(bank.path, "r")  # nothing of the batch reached the log either
    assert snapshot(reopened)[0] == before[0]


def test_missing_path(tmp_path):
    with pytest.raises(BankError, match="does not exist"):
        MemoryBank.open(tmp_path / "nope")


def test_folder_that_is_not_a_bank(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(BankFormatError, match="no MANIFEST.json"):
        MemoryBank.open(tmp_path / "x")


def test_other_format(tmp_path, bank):
    manifest = bank.path / "MANIFEST.json"
    bank.close()
    raw = json.loads(manifest.read_text())
    del raw["checksum"]
    manifest.write_bytes(seal(dict(raw, format="chroma")))
    with pytest.raises(BankFormatError, match="not a memr1 bank"):
        MemoryBank.open(bank.path)


def test_other_version(tmp_path, bank):
    manifest = bank.path / "MANIFEST.json"
    bank.close()
    raw = json.loads(manifest.read_text())
    del raw["checksum"]
    manifest.write_bytes(seal(dict(raw, version=99)))
    with pytest.raises(BankFormatError, match="version 99"):
        MemoryBank.open(bank.path)


def test_garbage_manifest(tmp_path, bank):
    bank.close()
    (bank.path / "MANIFEST.json").write_bytes(b"\x00\x01not json")
    with pytest.raises(BankFormatError, match="not valid JSON"):
        MemoryBank.open(bank.path)


def test_log_of_another_format(tmp_path, bank):
    bank.close()
    (bank.path / "log-0.oplog").write_bytes(b"SQLite format 3\x00" + bytes(64))
    with pytest.raises(BankFormatError, match="not a memr1 op log"):
        MemoryBank.open(bank.path)


def test_create_over_existing_bank(bank):
    with pytest.raises(BankError, match="already exists"):
        MemoryBank.create(bank.path, dim=DIM)


def test_write_to_read_only_bank(bank):
    reader = MemoryBank.open(bank.path, "r")
    before = snapshot(reader)
    for op in (Add("x", vec(), "A"), Update(0, "x", vec()), Delete(0), Noop()):
        with pytest.raises(ReadOnlyBank, match="read-only"):
            reader.apply(op)
    with pytest.raises(ReadOnlyBank):
        reader.compact()
    assert snapshot(reader) == before


def test_second_writer_fails_fast_and_readers_still_work(bank):
    code = (f"from memr1.memory_store import MemoryBank, BankLocked\n"
            f"try:\n    MemoryBank.open({str(bank.path)!r}, 'rw')\nexcept BankLocked as e:\n    print('LOCKED', e)\n"
            f"r = MemoryBank.open({str(bank.path)!r}, 'r')\nprint('READ', len(r))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "LOCKED" in out.stdout and "already open for writing" in out.stdout, out.stderr
    assert "READ 2" in out.stdout
    with pytest.raises(BankLocked):  # the same process opening again is a second writer too
        MemoryBank.open(bank.path, "rw")


def test_bad_mode_and_config(tmp_path, bank):
    with pytest.raises(InvalidInput, match="mode"):
        MemoryBank.open(bank.path, "w")
    with pytest.raises(InvalidInput, match="dim"):
        MemoryBank.create(tmp_path / "c")
    with pytest.raises(InvalidInput, match="fsync"):
        MemoryBank.create(tmp_path / "d", dim=4, fsync="sometimes")


def test_closed_bank_refuses_writes(bank):
    bank.close()
    with pytest.raises(BankError, match="closed"):
        bank.apply(Noop())


def test_importing_the_bank_before_torch_keeps_torch_messages_whole():
    """usearch (static libstdc++) loaded before torch cuts every torch message at its first number;
    memory_store loads the system libstdc++ globally first, so a process that imports the bank before
    torch keeps them whole."""
    code = ("import memr1.memory_store\n"
            "import torch\n"
            "try:\n"
            "    torch.ones(3) + torch.ones(4)\n"
            "except RuntimeError as e:\n"
            "    print(e)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "tensor a (3) must match the size of tensor b (4)" in res.stdout, res.stdout + res.stderr
