"""Memories carry the dialogue turns they came from (Memory.sources, for Memory-R2's evidence recall):
through forks, the op log, replay, compaction, reopening, readers and apply_batch; old logs and segments
(written before sources existed) still open, with empty sources; bad sources are refused, changing nothing."""
import base64

import msgspec
import numpy as np
import pytest

from memr1.memory_store import Add, BankFormatError, Delete, InvalidInput, MemoryBank, Noop, Update, _core, schema
from memr1.memory_store.manifest import read_manifest
from memr1.memory_store.schema import MAX_MEMORY_SOURCES, MAX_OP_SOURCES, MAX_SOURCE_BYTES

DIM = 4


def vec(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)


def payloads(log_path) -> list[bytes]:
    generation = int(log_path.name.removeprefix("log-").removesuffix(".oplog"))
    log = _core.OpLog(str(log_path), False, 0, 1, generation, read_manifest(log_path.parent).bank_id)
    try:
        return [bytes(p) for p in log.payloads()]
    finally:
        log.close()


def snapshot(bank) -> list:
    return [(m, bank._core.lsn) for m in bank]


def test_add_then_updates_append_new_sources_in_order():
    bank = MemoryBank.create(None, dim=DIM)
    i = bank.apply(Add("a", vec(0), "A", "t", ("D1:1", "D1:2", "D1:1")))  # a repeat within the op is dropped
    assert bank.get(i).sources == ("D1:1", "D1:2")
    bank.apply(Update(i, "b", vec(1), sources=("D1:2", "D2:5", "D2:6")))
    assert bank.get(i).sources == ("D1:1", "D1:2", "D2:5", "D2:6")
    bank.apply(Update(i, "c", vec(2)))  # no sources: keeps the memory's
    bank.apply(Update(i, "d", vec(3), "later", ["D3:1"]))  # a list is taken as well as a tuple
    m = bank.get(i)
    assert m.sources == ("D1:1", "D1:2", "D2:5", "D2:6", "D3:1") and m.text == "d" and m.timestamp == "later"
    j = bank.apply(Add("e", vec(4), "B"))  # existing call sites: no sources
    assert bank.get(j).sources == () and [m.sources for m in bank][1] == ()
    bank.apply(Delete(i))
    assert i not in bank and [m.id for m in bank] == [j]


def test_a_forks_update_adds_to_the_forks_memory_only():
    bank = MemoryBank.create(None, dim=DIM)
    i = bank.apply(Add("a", vec(0), "A", sources=("D1:1",)))
    child, sibling = bank.fork(), bank.fork()
    child.apply(Update(i, "child", vec(1), sources=("D1:2",)))
    bank.apply(Update(i, "parent", vec(2), sources=("D1:3",)))
    assert child.get(i).sources == ("D1:1", "D1:2")
    assert bank.get(i).sources == ("D1:1", "D1:3")
    assert sibling.get(i).sources == ("D1:1",)
    grandchild = child.fork()
    grandchild.apply(Update(i, "g", vec(3), sources=("D9:9",)))
    assert child.get(i).sources == ("D1:1", "D1:2") and grandchild.get(i).sources == ("D1:1", "D1:2", "D9:9")


def test_compaction_reopen_and_replay_keep_sources(tmp_path):
    path = tmp_path / "b"
    bank = MemoryBank.create(path, dim=DIM, hnsw_threshold=1)  # HNSW bases too
    ids = [bank.apply(Add(f"m{k}", vec(k), "AB"[k % 2], sources=(f"D1:{k}",))) for k in range(6)]
    bank.apply(Update(ids[0], "m0b", vec(10), sources=("D2:0",)))
    bank.compact()  # the sources go into base-1's records
    written = msgspec.msgpack.decode((path / "base-1" / "records.msgpack").read_bytes())
    assert [r["sources"] for r in written][:2] == [["D1:0", "D2:0"], ["D1:1"]]
    bank.apply(Update(ids[1], "m1b", vec(11), sources=("D2:1", "D1:1")))  # on a base row: appended to its sources
    bank.apply(Update(ids[0], "m0c", vec(12), sources=("D3:0",)))
    bank.apply(Delete(ids[2]))
    want = list(bank)
    assert bank.get(ids[0]).sources == ("D1:0", "D2:0", "D3:0") and bank.get(ids[1]).sources == ("D1:1", "D2:1")
    reader = MemoryBank.open(path, "r")  # while the writer holds the log: a copy of it, replayed
    assert list(reader) == want
    bank.close()
    for mode in ("r", "rw"):  # the base segment and a replayed log with sources
        again = MemoryBank.open(path, mode)
        assert list(again) == want
        again.close()
    bank = MemoryBank.open(path, "rw")
    bank.compact()
    bank.close()
    bank = MemoryBank.open(path, "rw")
    assert list(bank) == want and bank.stats()["delta_rows"] == 0
    hits = bank.search(vec(11), 1, speaker="B")
    assert bank.get(int(hits.ids[0])).sources == ("D1:1", "D2:1")
    saved = bank.fork().save(tmp_path / "saved")  # a fork written as a bank of its own
    assert list(saved) == want
    saved.close()
    bank.close()


def test_apply_batch_carries_sources_all_or_nothing(tmp_path):
    bank = MemoryBank.create(tmp_path / "b", dim=DIM)
    i = bank.apply(Add("a", vec(0), "A", sources=("D1:1",)))
    before = snapshot(bank)
    with pytest.raises(InvalidInput, match="sources"):
        bank.apply_batch([Update(i, "b", vec(1), sources=("D1:2",)), Add("c", vec(2), "A", sources=("",))])
    assert snapshot(bank) == before
    assert bank.apply_batch([Update(i, "b", vec(1), sources=("D1:2",)), Add("c", vec(2), "A", sources=("D1:3",))]) \
        == [i, 1]
    want = list(bank)
    assert [m.sources for m in want] == [("D1:1", "D1:2"), ("D1:3",)]
    bank.close()
    bank = MemoryBank.open(tmp_path / "b", "r")
    assert list(bank) == want


def test_a_log_written_with_sources_reopens(tmp_path):
    """No kill, no compaction: close, and the log alone rebuilds every memory's sources."""
    path = tmp_path / "b"
    bank = MemoryBank.create(path, dim=DIM, fsync="op")
    for k in range(20):
        bank.apply(Add(f"m{k}", vec(k), "A", sources=tuple(f"D{k}:{t}" for t in range(k % 4))))
    for k in range(0, 20, 3):
        bank.apply(Update(k, f"u{k}", vec(100 + k), sources=(f"D{k}:0", f"E{k}:1")))
    bank.apply(Noop())
    want = list(bank)
    bank.close()
    assert len(payloads(path / "log-0.oplog")) == 28
    bank = MemoryBank.open(path, "rw")
    assert list(bank) == want and bank.stats()["base_rows"] == 0
    assert bank.get(3).sources == ("D3:0", "D3:1", "D3:2", "E3:1")
    bank.close()


# ---- the encoding from before sources existed ----
class OldAdd(msgspec.Struct, array_like=True, tag="add"):
    id: int
    text: str
    speaker: str
    timestamp: str
    vector: bytes


class OldUpdate(msgspec.Struct, array_like=True, tag="update"):
    id: int
    text: str
    timestamp: str | None
    vector: bytes


def frame(payload: bytes) -> bytes:
    """One op-log frame (oplog.cpp): length, CRC32C of length and payload, the payload, zeros to 8 bytes."""
    n = len(payload).to_bytes(4, "little")
    return n + _core.crc32c(n + payload).to_bytes(4, "little") + payload + bytes(-len(payload) % 8)


def test_ops_without_sources_are_logged_in_the_old_encoding(tmp_path):
    bank = MemoryBank.create(tmp_path / "b", dim=DIM)
    bank.apply(Add("a", vec(0), "A", "t"))
    bank.apply(Update(0, "b", vec(1)))
    bank.apply(Update(0, "c", vec(2), "t2", sources=("D1:1",)))
    bank.close()
    got = payloads(tmp_path / "b" / "log-0.oplog")
    assert got[:2] == [msgspec.msgpack.encode(OldAdd(0, "a", "A", "t", vec(0).tobytes())),
                       msgspec.msgpack.encode(OldUpdate(0, "b", None, vec(1).tobytes()))]
    assert msgspec.msgpack.decode(got[2]) == ["update", 0, "c", "t2", vec(2).tobytes(), ["D1:1"]]


def test_a_log_in_the_old_encoding_replays_with_empty_sources(tmp_path):
    path = tmp_path / "b"
    MemoryBank.create(path, dim=DIM).close()
    old = [OldAdd(0, "a", "A", "t", vec(0).tobytes()), OldAdd(1, "b", "B", "", vec(1).tobytes()),
           OldUpdate(0, "a2", None, vec(2).tobytes())]
    with open(path / "log-0.oplog", "ab") as f:  # close() trimmed the log to its last frame
        for rec in old:
            f.write(frame(msgspec.msgpack.encode(rec)))
    bank = MemoryBank.open(path, "rw")
    assert [(m.id, m.text, m.previous_text, m.sources) for m in bank] == [(0, "a2", "a", ()), (1, "b", None, ())]
    bank.apply(Update(0, "a3", vec(3), sources=("D1:1",)))  # new records after old ones, in one log
    bank.close()
    bank = MemoryBank.open(path, "r")
    assert [m.sources for m in bank] == [("D1:1",), ()]


# A bank written by the code before sources existed (dim 4; fsync "op"): base-1 holds ids 0-2 (id 1
# updated before compaction), log-1 adds id 3, updates id 0 and deletes id 2. Made by an earlier build,
# of format version 2: its op log names no bank, so this code refuses it (callers rebuild such banks).
OLD_BANK = {
    "MANIFEST.json": ("eyJmb3JtYXQiOiJtZW1yMS1iYW5rIiwidmVyc2lvbiI6MiwiY29uZmlnIjp7ImRpbSI6NCwibWF4X3RleHRfYnl0ZXMiOjQw"
        "OTYsImZzeW5jIjoib3AiLCJmc3luY19ldmVyeSI6NjQsImhuc3dfdGhyZXNob2xkIjo0MDk2LCJobnN3X2Nvbm5lY3Rpdml0"
        "eSI6MTYsImhuc3dfZXhwYW5zaW9uX2FkZCI6NjQsImhuc3dfZXhwYW5zaW9uX3NlYXJjaCI6NjQsImhuc3dfZHR5cGUiOiJp"
        "OCIsImhuc3dfb3ZlcnNhbXBsZSI6Mi4wLCJhdXRvX2NvbXBhY3RfcmF0aW8iOjAuMDIsImF1dG9fY29tcGFjdF9taW5fcm93"
        "cyI6MjA0OH0sImdlbmVyYXRpb24iOjEsIm5leHRfaWQiOjMsImxzbiI6NCwiYmFzZV9yb3dzIjozLCJzcGVha2Vyc19pbmRl"
        "eGVkIjpbXSwiZmlsZXMiOnsicmVjb3Jkcy5tc2dwYWNrIjpbMjE3LDI0NzgxNjYxMjldLCJ2ZWN0b3JzLmYzMiI6WzQ4LDUx"
        "MTY1NzA2NF19fQ=="),
    "base-1/records.msgpack": ("k4eiaWQApHRleHSkemVyb6dzcGVha2VyoUGpdGltZXN0YW1wonQwp2NyZWF0ZWQAp3VwZGF0ZWQArXByZXZpb3VzX3RleHTA"
        "h6JpZAGkdGV4dKVvbmUgYqdzcGVha2VyoUKpdGltZXN0YW1wonQxp2NyZWF0ZWQBp3VwZGF0ZWQDrXByZXZpb3VzX3RleHSj"
        "b25lh6JpZAKkdGV4dKN0d2+nc3BlYWtlcqFBqXRpbWVzdGFtcKJ0MqdjcmVhdGVkAqd1cGRhdGVkAq1wcmV2aW91c190ZXh0"
        "wA=="),
    "base-1/vectors.f32": ("bL8APn9GB7698iM/39XWPWueAkAEkCPADRHWPllZEb82l0E+2NIFvxF9074AQRzA"),
    "log-1.oplog": ("TUVNUjFMT0cBAAAAAAAAAAEAAAAAAAAAAAAAAAAAAAAjAAAAab8ecJajYWRkA6V0aHJlZaFConQzxBDJ2ya/F+kyvuj01D/o"
        "vSg/AAAAAAAjAAAAzk41lJWmdXBkYXRlAKZ6ZXJvIGLAxBBhS02/mISpv4JSfr6ZRNc+AAAAAAAJAAAANQu2qJKmZGVsZXRl"
        "AgAAAAAAAAA="),
}


def test_a_bank_of_format_version_2_is_refused_and_left_as_it_was(tmp_path):
    path = tmp_path / "old"
    path.mkdir()
    for name, data in OLD_BANK.items():
        (path / name).parent.mkdir(exist_ok=True)
        (path / name).write_bytes(base64.b64decode(data))
    for mode in ("r", "rw"):
        with pytest.raises(BankFormatError, match="bank of version 2; this code reads version 3 only"):
            MemoryBank.open(path, mode)
    assert sorted(p.name for p in path.iterdir()) == sorted({n.split("/")[0] for n in OLD_BANK})


# ---- bad sources ----
BAD = {
    "a bare str": ("D1:1", "sources must be a tuple of str .*got str"),
    "None": (None, "sources must be a tuple of str .*got NoneType"),
    "bytes in it": ((b"D1:1",), r"sources\[0\] must be a str, got bytes"),
    "an int in it": (("D1:1", 7), r"sources\[1\] must be a str, got int"),
    "an empty id": (("D1:1", ""), r"sources\[1\] is empty"),
    "an id too long": (("x" * (MAX_SOURCE_BYTES + 1),),
                       rf"sources\[0\] is {MAX_SOURCE_BYTES + 1} bytes, over the limit"),
    "too long in UTF-8": (("é" * 33,), r"sources\[0\] is 66 bytes"),
    "a lone surrogate": (("\ud800",), r"sources\[0\] is not encodable as UTF-8"),
    "too many ids": (tuple(f"D{k}" for k in range(MAX_OP_SOURCES + 1)),
                     f"{MAX_OP_SOURCES + 1} turn ids, over the limit"),
}


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("kind", ["add", "update"])
def test_bad_sources_are_refused_and_change_nothing(tmp_path, case, kind):
    sources, message = BAD[case]
    bank = MemoryBank.create(tmp_path / "b", dim=DIM)
    i = bank.apply(Add("a", vec(0), "A", sources=("D1:1",)))
    before, log = snapshot(bank), (tmp_path / "b" / "log-0.oplog")
    op = Add("b", vec(1), "A", sources=sources) if kind == "add" else Update(i, "b", vec(1), sources=sources)
    with pytest.raises(InvalidInput, match=message):
        bank.apply(op)
    assert snapshot(bank) == before
    bank.close()
    assert len(payloads(log)) == 1  # nothing logged either
    assert snapshot(MemoryBank.open(tmp_path / "b", "r")) == before


def test_a_memory_holds_at_most_max_memory_sources(tmp_path):
    bank = MemoryBank.create(tmp_path / "b", dim=DIM)
    per_op = MAX_OP_SOURCES
    i = bank.apply(Add("a", vec(0), "A", sources=tuple(f"T0:{t}" for t in range(per_op))))
    for u in range(1, MAX_MEMORY_SOURCES // per_op):
        bank.apply(Update(i, f"u{u}", vec(u), sources=tuple(f"T{u}:{t}" for t in range(per_op))))
    assert len(bank.get(i).sources) == MAX_MEMORY_SOURCES
    bank.apply(Update(i, "same ids", vec(7), sources=("T0:0", "T5:5")))  # nothing new: still fits
    assert len(bank.get(i).sources) == MAX_MEMORY_SOURCES
    before = snapshot(bank)
    with pytest.raises(InvalidInput, match=f"would hold {MAX_MEMORY_SOURCES + 1} source turn ids, over the limit"):
        bank.apply(Update(i, "one more", vec(8), sources=("T0:0", "new")))
    assert snapshot(bank) == before
    bank.close()
    assert snapshot(MemoryBank.open(tmp_path / "b", "r")) == before


def test_the_bounds_are_the_native_cores():
    assert (schema.MAX_OP_SOURCES, schema.MAX_SOURCE_BYTES, schema.MAX_MEMORY_SOURCES) == (
        _core.MAX_OP_SOURCES, _core.MAX_SOURCE_BYTES, _core.MAX_MEMORY_SOURCES)


def test_bulk_loaded_rows_have_no_sources():
    bank = MemoryBank.from_arrays(None, np.stack([vec(0), vec(1)]), ["a", "b"], ["A", "A"], ["", ""])
    assert [m.sources for m in bank] == [(), ()]
    bank.apply(Update(1, "b2", vec(2), sources=("D1:1",)))
    assert [m.sources for m in bank] == [(), ("D1:1",)]
