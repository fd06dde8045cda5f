"""Every count in BankConfig has an upper bound that any bank written with it opens under again, and a
create that failed or was killed leaves a folder that the next create takes over."""
import os
import signal
import subprocess
import sys
import typing

import msgspec
import numpy as np
import pytest

from memr1.memory_store import Add, BankError, BankFormatError, InvalidInput, MemoryBank
from memr1.memory_store.schema import MAX_COUNT, MAX_EXPANSION, BankConfig

DIM = 8
BOUNDED = {"fsync_every": MAX_COUNT, "hnsw_threshold": MAX_COUNT, "auto_compact_min_rows": MAX_COUNT,
           "hnsw_expansion_add": MAX_EXPANSION, "hnsw_expansion_search": MAX_EXPANSION}


def rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def test_every_numeric_config_field_has_an_upper_bound():
    hints = typing.get_type_hints(BankConfig, include_extras=True)
    numeric = [name for name, t in hints.items() if t in (int, float) or typing.get_origin(t) is typing.Annotated]
    assert len(numeric) >= 12
    for name in numeric:
        assert typing.get_origin(hints[name]) is typing.Annotated, name
        meta = hints[name].__metadata__[0]
        assert meta.le is not None or meta.lt is not None, name


@pytest.mark.parametrize("name", BOUNDED)
def test_past_the_bound_is_refused_in_one_line(tmp_path, name):
    with pytest.raises(InvalidInput, match=name) as e:
        MemoryBank.create(tmp_path / "b", dim=DIM, **{name: BOUNDED[name] + 1})
    assert "\n" not in str(e.value)
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("index", [False, True])
def test_a_bank_written_at_every_bound_opens_and_searches(tmp_path, index):
    """At the bounds (with a small hnsw_threshold too, so that graphs are built with the largest beams)."""
    path = tmp_path / "b"
    settings = dict(BOUNDED, fsync="every_n", auto_compact_ratio=100.0)
    if index:
        settings["hnsw_threshold"] = 16
    vectors = rows(64)
    bank = MemoryBank.create(path, dim=DIM, **settings)
    for i, v in enumerate(vectors):
        bank.apply(Add(f"m{i}", v, "AB"[i % 2]))
    bank.compact()
    bank.close()
    for mode in ("rw", "r"):
        with MemoryBank.open(path, mode) as again:
            assert again.stats()["hnsw_speakers"] == (["A", "B"] if index else [])
            ids, _ = again.search(vectors[3], k=1, speaker="B")
            assert ids.tolist() == [3]
            assert again.search(vectors[3], k=1, speaker="B", exact=True).ids.tolist() == [3]


def test_a_manifest_past_a_bound_is_refused(tmp_path):
    from memr1.memory_store import _core
    from memr1.memory_store.manifest import _canonical
    path = tmp_path / "b"
    MemoryBank.create(path, dim=DIM).close()
    raw = msgspec.json.decode((path / "MANIFEST.json").read_bytes())
    raw.pop("checksum")
    raw["config"]["fsync_every"] = MAX_COUNT + 1
    raw["checksum"] = _core.crc32c(_canonical(raw))
    (path / "MANIFEST.json").write_bytes(msgspec.json.encode(raw))
    with pytest.raises(BankFormatError, match="fsync_every") as e:
        MemoryBank.open(path, "r")
    assert "\n" not in str(e.value)


# ---- creates that fail or are killed
def killed_create(path, at: str) -> None:
    """Create a bank at `path` in a child process killed (SIGKILL) at `at`: the manifest's write, or the
    op log's creation."""
    code = (
        "import os, signal, sys\n"
        "from memr1.memory_store import MemoryBank, manifest, storage\n"
        "def die(*a, **k):\n    os.kill(os.getpid(), signal.SIGKILL)\n"
        f"if {at!r} == 'manifest':\n    storage.write_manifest = die\n"
        f"else:\n    storage._core.OpLog.create = die\n"
        f"MemoryBank.create({str(path)!r}, dim={DIM})\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == -signal.SIGKILL, out.stderr


@pytest.mark.parametrize("at", ["manifest", "oplog"])
def test_a_killed_create_leaves_a_folder_create_redoes(tmp_path, at):
    path = tmp_path / "b"
    killed_create(path, at)
    assert path.is_dir() and not (path / "MANIFEST.json").exists()
    with pytest.raises(BankError, match="MANIFEST"):
        MemoryBank.open(path, "r")
    bank = MemoryBank.create(path, dim=DIM)
    bank.apply(Add("m", rows(1)[0], "A"))
    bank.close()
    with MemoryBank.open(path, "r") as again:
        assert [m.text for m in again] == ["m"]


def test_a_folder_without_a_manifest_is_taken_over_and_anything_else_is_not(tmp_path):
    path = tmp_path / "b"
    MemoryBank.create(path, dim=DIM).close()
    (path / "MANIFEST.json").unlink()   # what a kill just before the commit point leaves
    (path / "MANIFEST.json.tmp").write_bytes(b"{")
    MemoryBank.create(path, dim=DIM).close()
    assert sorted(os.listdir(path)) == ["LOCK", "MANIFEST.json", "base-0", "log-0.oplog"]
    with pytest.raises(BankError, match="not an empty folder"):   # a bank is never overwritten
        MemoryBank.create(path, dim=DIM)
    (path / "MANIFEST.json").unlink()
    (path / "notes.txt").write_text("mine")
    with pytest.raises(BankError, match="not an empty folder"):   # nor a folder holding anything else
        MemoryBank.create(path, dim=DIM)
    assert (path / "notes.txt").read_text() == "mine"


def test_a_create_while_another_writes_the_folder_fails_cleanly(tmp_path):
    """A partial folder whose create is still running (it holds the writer lock) is not cleared."""
    path = tmp_path / "b"
    MemoryBank.create(path, dim=DIM).close()
    (path / "MANIFEST.json").unlink()
    from memr1.memory_store.storage import lock, unlock
    fd = lock(path)
    try:
        with pytest.raises(BankError, match="already open for writing"):
            MemoryBank.create(path, dim=DIM)
        assert (path / "base-0").is_dir()
    finally:
        unlock(fd)
