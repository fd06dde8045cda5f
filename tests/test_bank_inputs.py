"""Table-driven: every bad input to the bank, and every damaged file of a bank on disk, raises a BankError
subclass whose message names the bad argument or file; a refused op leaves the bank as it was."""
import json
import math
import shutil

import numpy as np
import pytest

from memr1.memory_store import (Add, BankConfig, BankError, BankFormatError, Delete, InvalidInput, MemoryBank,
                                UnknownMemoryId, Update)
from memr1.memory_store.manifest import seal

DIM = 8


def vec(seed=0):
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)


@pytest.fixture
def bank(tmp_path):
    b = MemoryBank.create(tmp_path / "b", dim=DIM, max_text_bytes=64)
    for i in range(3):
        b.apply(Add(f"fact {i}", vec(i), "A", "t"))
    yield b
    b.close()


def snapshot(b):
    return list(b), b.stats()


def check(call, exc, fragments):
    with pytest.raises(exc) as err:
        call()
    assert isinstance(err.value, BankError), type(err.value)
    for f in fragments:
        assert f in str(err.value), f"{f!r} not in {str(err.value)!r}"
    assert "\n" not in str(err.value)


# (op, error, fragments the message must hold): each names the op's bad field.
BAD_OPS = [
    (Delete(2**63), UnknownMemoryId, ["memory id 9223372036854775808"]),
    (Delete(2**64 + 5), UnknownMemoryId, ["memory id"]),
    (Delete(-2**63 - 1), UnknownMemoryId, ["memory id"]),
    (Update(2**63, "x", vec()), UnknownMemoryId, ["memory id"]),
    (Delete(True), InvalidInput, ["memory id", "bool"]),
    (Delete(False), InvalidInput, ["memory id", "bool"]),
    (Update(True, "x", vec()), InvalidInput, ["memory id", "bool"]),
    (Delete(2.5), InvalidInput, ["memory id", "float"]),
    (Delete("1"), InvalidInput, ["memory id", "str"]),
    (Delete(None), InvalidInput, ["memory id", "NoneType"]),
    (Add("x", vec(), 5), InvalidInput, ["speaker", "int"]),
    (Add("x", vec(), None), InvalidInput, ["speaker", "NoneType"]),
    (Add("x", vec(), b"A"), InvalidInput, ["speaker", "bytes"]),
    (Add("x", vec(), "\ud800"), InvalidInput, ["speaker", "surrogate"]),
    (Add(5, vec(), "A"), InvalidInput, ["text", "int"]),
    (Add(b"x", vec(), "A"), InvalidInput, ["text", "bytes"]),
    (Add("\ud800", vec(), "A"), InvalidInput, ["text", "surrogate"]),
    (Update(0, None, vec()), InvalidInput, ["text", "NoneType"]),
    (Add("x", vec(), "A", 5), InvalidInput, ["timestamp", "int"]),
    (Update(0, "x", vec(), 5), InvalidInput, ["timestamp", "int"]),
    (Add("x", None, "A"), InvalidInput, ["vector", "NoneType"]),
]


@pytest.mark.parametrize("op, exc, fragments", BAD_OPS, ids=[repr(o[0])[:40] for o in BAD_OPS])
def test_bad_op(bank, op, exc, fragments):
    before = snapshot(bank)
    check(lambda: bank.apply(op), exc, fragments)
    check(lambda: bank.apply_batch([Add("ok", vec(9), "A"), op]), exc, fragments)
    assert snapshot(bank) == before, "a rejected op changed the bank"
    bank.close()
    assert snapshot(MemoryBank.open(bank.path, "r")) == before, "a rejected op reached the log"


BAD_READS = [
    (lambda b: b.search(vec(), 2**31), InvalidInput, ["k", "[0, 2**31)"]),
    (lambda b: b.search(vec(), -1), InvalidInput, ["k", "[0, 2**31)"]),
    (lambda b: b.search(vec(), None), InvalidInput, ["k", "NoneType"]),
    (lambda b: b.search(vec(), 2.5), InvalidInput, ["k", "float"]),
    (lambda b: b.search(vec(), True), InvalidInput, ["k", "bool"]),
    (lambda b: b.search(vec(), "3"), InvalidInput, ["k", "str"]),
    (lambda b: b.search(vec(), 5, speaker=5), InvalidInput, ["speaker", "int"]),
    (lambda b: b.search(vec(), 5, speaker=b"A"), InvalidInput, ["speaker", "bytes"]),
    (lambda b: b.items_for_prompt(k=2.5), InvalidInput, ["k", "float"]),
    (lambda b: b.items_for_prompt(vec(), k=-3), InvalidInput, ["k"]),
    (lambda b: b.get(True), InvalidInput, ["memory id", "bool"]),
    (lambda b: b.get("0"), InvalidInput, ["memory id", "str"]),
    (lambda b: b.get(2**63), UnknownMemoryId, ["memory id"]),
    (lambda b: b.apply_batch(5), InvalidInput, ["ops", "int"]),
]


@pytest.mark.parametrize("call, exc, fragments", BAD_READS, ids=range(len(BAD_READS)))
def test_bad_read_argument(bank, call, exc, fragments):
    before = snapshot(bank)
    check(lambda: call(bank), exc, fragments)
    assert snapshot(bank) == before


def test_ids_are_ints_and_huge_k_is_fine(bank):
    assert bank.get(np.int64(1)).text == "fact 1"  # integer-likes are ids; bools are not
    assert True not in bank and 2**63 not in bank and "0" not in bank and 0 in bank
    assert len(bank.search(vec(), 2**31 - 1).ids) == 3  # k is clamped to the live rows, not allocated


BAD_SETTINGS = [
    (dict(dim=-4), ["dim=-4", ">= 1"]),
    (dict(dim=0), ["dim=0", ">= 1"]),
    (dict(dim=2.5), ["dim=2.5", "int"]),
    (dict(dim=True), ["dim=True", "int"]),
    (dict(dim=10**6), ["dim=1000000", "<= 65536"]),
    (dict(dim=4, max_text_bytes=0), ["max_text_bytes=0", ">= 1"]),
    (dict(dim=4, fsync="bogus"), ["fsync='bogus'", "never"]),
    (dict(dim=4, fsync_every=0), ["fsync_every=0", ">= 1"]),
    (dict(dim=4, hnsw_oversample=-1.0), ["hnsw_oversample=-1.0", ">= 1.0"]),
    (dict(dim=4, hnsw_oversample=math.nan), ["hnsw_oversample=nan"]),
    (dict(dim=4, hnsw_oversample=math.inf), ["hnsw_oversample=inf", "<= 1000.0"]),
    (dict(dim=4, hnsw_connectivity=1), ["hnsw_connectivity=1", ">= 2"]),
    (dict(dim=4, hnsw_dtype="f64"), ["hnsw_dtype='f64'"]),
    (dict(dim=4, bogus_setting=1), ["bogus_setting"]),
    (dict(config="dim=4"), ["config", "str"]),
    (dict(config=BankConfig(dim=0)), ["dim=0"]),
    (dict(dim=4, config=BankConfig(dim=8)), ["dim=4", "config.dim=8"]),
]


@pytest.mark.parametrize("kwargs, fragments", BAD_SETTINGS, ids=[str(k)[:40] for k, _ in BAD_SETTINGS])
def test_bad_setting(tmp_path, kwargs, fragments):
    check(lambda: MemoryBank.create(tmp_path / "b", **kwargs), InvalidInput, fragments)
    check(lambda: MemoryBank.create(None, **kwargs), InvalidInput, fragments)
    assert not (tmp_path / "b").exists(), "a refused create wrote files"


def test_bad_open_and_load_arguments(tmp_path, bank):
    bank.close()
    v = np.stack([vec(i) for i in range(2)])
    cases = [
        (lambda: MemoryBank.open(bank.path, fsync="bogus"), ["fsync", "'bogus'"]),
        (lambda: MemoryBank.open(bank.path, fsync=["op"]), ["fsync"]),
        (lambda: MemoryBank.open(bank.path, "w"), ["mode", "'w'"]),
        (lambda: MemoryBank.open(5), ["path", "int"]),
        (lambda: MemoryBank.create(5, dim=4), ["path", "int"]),
        (lambda: MemoryBank.from_arrays(None, v, [5, "b"], ["A", "A"], ["t", "t"]), ["texts[0]", "int"]),
        (lambda: MemoryBank.from_arrays(None, v, ["a", "b"], ["A", None], ["t", "t"]), ["speakers[1]", "NoneType"]),
        (lambda: MemoryBank.from_arrays(None, v, ["a", "b"], ["A", "A"], ["t", 3]), ["timestamps[1]", "int"]),
        (lambda: MemoryBank.from_arrays(None, v, "ab", ["A", "A"], ["t", "t"]), ["texts", "list"]),
        (lambda: MemoryBank.from_arrays(None, v, ["a", "\ud800"], ["A", "A"], ["t", "t"]), ["texts[1]", "surrogate"]),
        (lambda: MemoryBank.from_arrays(None, [[1.0], [1.0, 2.0]], ["a", "b"], ["A", "A"], ["t", "t"], dim=2),
         ["vectors"]),
    ]
    for call, fragments in cases:
        check(call, InvalidInput, fragments)


# ---- damaged files: (what to do to a closed bank, fragment naming the file) ----
def edit_manifest(path, **changes):
    """Change members of a bank's manifest, sealed with a checksum that matches (a damage the checksum
    does not catch, for the checks after it)."""
    raw = json.loads((path / "MANIFEST.json").read_text())
    del raw["checksum"]
    for key, value in changes.items():
        if value is ...:
            raw.pop(key)
        elif key == "config":
            raw["config"].update(value)
        else:
            raw[key] = value
    (path / "MANIFEST.json").write_bytes(seal(raw))


def without(name, path):
    files = json.loads((path / "MANIFEST.json").read_text())["files"]
    return {k: v for k, v in files.items() if k != name}


def flip(file, offset):
    data = bytearray(file.read_bytes())
    data[offset] ^= 0x01
    file.write_bytes(bytes(data))


DAMAGE = {
    "records missing": (lambda p: (p / "base-0/records.msgpack").unlink(), "base-0/records.msgpack"),
    "records garbage": (lambda p: (p / "base-0/records.msgpack").write_bytes(b"\xc1\xc1"), "base-0/records.msgpack"),
    "vectors truncated": (lambda p: (p / "base-0/vectors.f32").write_bytes(b"\0" * 12), "base-0/vectors.f32"),
    "vector bit flipped": (lambda p: flip(p / "base-0/vectors.f32", 7), "base-0/vectors.f32"),
    "hnsw bit flipped": (lambda p: flip(p / "base-0/hnsw-0.usearch", 300), "base-0/hnsw-0.usearch"),
    "vectors a folder": (lambda p: ((p / "base-0/vectors.f32").unlink(), (p / "base-0/vectors.f32").mkdir()),
                         "base-0/vectors.f32"),
    "base missing": (lambda p: shutil.rmtree(p / "base-0"), "base-0"),
    "log missing": (lambda p: (p / "log-0.oplog").unlink(), "log-0.oplog"),
    "log a folder": (lambda p: ((p / "log-0.oplog").unlink(), (p / "log-0.oplog").mkdir()), "log-0.oplog"),
    "log of another generation": (lambda p: flip(p / "log-0.oplog", 16), "log-0.oplog"),
    "manifest field missing": (lambda p: edit_manifest(p, generation=...), "MANIFEST.json"),
    "manifest generation negative": (lambda p: edit_manifest(p, generation=-1), "MANIFEST.json"),
    "manifest generation absent": (lambda p: edit_manifest(p, generation=5), "base-5"),
    "manifest dim 0": (lambda p: edit_manifest(p, config={"dim": 0}), "MANIFEST.json"),
    "manifest dim wrong": (lambda p: edit_manifest(p, config={"dim": 4}), "base-0/vectors.f32"),
    "manifest rows wrong": (lambda p: edit_manifest(p, base_rows=99), "base-0/records.msgpack"),
    "manifest no checksums": (lambda p: edit_manifest(p, files={}), "MANIFEST.json"),
    "manifest checksum missing": (lambda p: edit_manifest(p, files=without("vectors.f32", p)), "vectors.f32"),
    "manifest a folder": (lambda p: ((p / "MANIFEST.json").unlink(), (p / "MANIFEST.json").mkdir()), "MANIFEST.json"),
}


@pytest.mark.parametrize("case", DAMAGE)
@pytest.mark.parametrize("mode", ["r", "rw"])
def test_damaged_bank_file(tmp_path, case, mode):
    n = 300
    v = np.random.default_rng(0).standard_normal((n, DIM)).astype(np.float32)
    bank = MemoryBank.from_arrays(tmp_path / "b", v, [f"m{i}" for i in range(n)], ["A"] * n, ["t"] * n,
                                  hnsw_threshold=100)
    bank.apply(Add("after", vec(), "A"))
    bank.close()
    damage, fragment = DAMAGE[case]
    damage(tmp_path / "b")
    for _ in range(2):  # a refused writer open releases the lock: the second try fails the same way
        check(lambda: MemoryBank.open(tmp_path / "b", mode), BankFormatError, [fragment])


def test_lock_that_is_a_folder(bank):
    bank.close()
    (bank.path / "LOCK").unlink()
    (bank.path / "LOCK").mkdir()
    check(lambda: MemoryBank.open(bank.path, "rw"), BankFormatError, ["LOCK", "directory"])
    assert len(MemoryBank.open(bank.path, "r")) == 3  # readers take no lock


@pytest.mark.parametrize("version", [1, 2])
def test_a_bank_of_an_older_version_is_refused(bank, version):
    bank.close()
    edit_manifest(bank.path, version=version, files=...)
    for mode in ("r", "rw"):
        check(lambda: MemoryBank.open(bank.path, mode), BankFormatError, [f"version {version}", "reads version 3"])
