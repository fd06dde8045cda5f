"""Readers beside a live writer, and a full disk.

Readers run in child processes, so a SIGBUS or a stray exception shows as a failed child, not a dead
pytest. Every snapshot a reader opens must equal the writer's state after some prefix of its ops."""
import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bank_model import ModelBank, assert_same, model_after, op_stream
from memr1.memory_store import BankError, BankIOError, MemoryBank

TESTS = str(Path(__file__).resolve().parent)
DIM = 256          # large records: the log reaches megabytes, so a reader scans it for a while
ROUNDS, PER_ROUND, SEED = 24, 80, 11


def child(function: str, *args) -> subprocess.Popen:
    code = f"import sys; sys.path.insert(0, {TESTS!r}); import test_bank_readers as t; t.{function}(*sys.argv[1:])"
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def reader_main(path: str, stop: str, report: str) -> None:
    """Open the bank read-only again and again until `stop` exists; check each snapshot."""
    ops = op_stream(SEED, ROUNDS * PER_ROUND, DIM)
    query = np.random.default_rng(5).standard_normal(DIM).astype(np.float32)
    model, applied, opens = ModelBank(), 0, 0
    while not os.path.exists(stop) or opens == 0:
        bank = MemoryBank.open(path, "r")
        p = bank.stats()["ops"]
        assert p >= applied, f"a later snapshot went back from op {applied} to {p}"
        for op in ops[applied:p]:
            model.apply(op)
        applied = p
        assert_same(bank, model)
        assert len(bank.search(query, 5).ids) == min(5, len(bank))  # reads the mapped base and its HNSW views
        bank.close()
        opens += 1
    Path(report).write_text(json.dumps({"opens": opens, "last_op": applied}))


def generations(path: Path) -> set[str]:
    return {p.name for p in path.iterdir() if p.name.startswith(("base-", "log-"))}


def test_readers_never_crash_while_the_writer_closes_compacts_and_deletes(tmp_path):
    path, stop = tmp_path / "bank", tmp_path / "stop"
    ops = op_stream(SEED, ROUNDS * PER_ROUND, DIM)
    bank = MemoryBank.create(path, dim=DIM, fsync="never", hnsw_threshold=40)
    readers = [child("reader_main", path, stop, tmp_path / f"report-{i}") for i in range(2)]
    time.sleep(1.0)  # the children import numpy and the bank first
    half = PER_ROUND // 2
    for r in range(ROUNDS):  # each round: ops, a compaction (old generation deleted), ops, close, reopen
        chunk = ops[r * PER_ROUND:(r + 1) * PER_ROUND]
        for i, op in enumerate(chunk):
            bank.apply(op)
            if i == half:
                bank.compact()
            if i % 10 == 9:
                time.sleep(0.003)  # let readers open in every phase of the round
        bank.close()
        time.sleep(0.003)
        bank = MemoryBank.open(path, "rw", fsync="never")
    stop.touch()
    errs = [p.communicate(timeout=120)[1] for p in readers]
    for i, (p, err) in enumerate(zip(readers, errs)):
        assert p.returncode == 0, f"reader {i} failed (exit {p.returncode}; -7 is SIGBUS):\n{err[-3000:]}"
    reports = [json.loads((tmp_path / f"report-{i}").read_text()) for i in range(2)]
    print("reader opens:", reports)
    assert all(r["opens"] >= 20 for r in reports), reports
    # Old generations do get deleted: once no reader holds one, only the current generation is left.
    bank.close()
    bank = MemoryBank.open(path, "rw")
    gen = bank._manifest.generation
    assert gen == ROUNDS and generations(path) == {f"base-{gen}", f"log-{gen}.oplog"}
    assert_same(bank, model_after(ops, len(ops)))
    bank.close()


# ---- a full disk ----
FULL_DIM = 256  # ~1 KiB records: the 2 MiB the log reserves first holds ~2,600 ops


def fill(folder: Path) -> Path:
    """Write a file until the file system is full."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    for chunk in (1 << 16, 1 << 12):
        try:
            while True:
                os.write(fd, b"\xff" * chunk)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
    os.close(fd)
    return filler


def disk_full_main(folder: str, how: str, report: str) -> None:
    """The bank in `folder`, which is a small tmpfs (how="tmpfs") or any folder whose files this process
    may not grow (how="rlimit"): ops until the disk refuses, the checks, then space back."""
    folder = Path(folder)
    path = folder / "bank"
    ops = op_stream(3, 8_000, FULL_DIM)
    bank = MemoryBank.create(path, dim=FULL_DIM, hnsw_threshold=10**6)
    acked = 0
    for op in ops[:50]:
        bank.apply(op)
        acked += 1
    if how == "tmpfs":
        filler = fill(folder)
    else:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so an over-limit write fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
    with pytest.raises(BankIOError):  # more than the log has reserved: all of the batch or nothing
        bank.apply_batch(ops[acked:acked + 4_000])
    with pytest.raises(BankIOError) as err:  # the log's reserved space runs out, then it cannot grow
        for op in ops[acked:]:
            bank.apply(op)
            acked += 1
    e = err.value
    assert isinstance(e, BankError) and e.errno in (errno.ENOSPC, errno.EFBIG) and str(path) in str(e), e
    assert bank.stats()["ops"] == acked
    model = model_after(ops, acked)
    assert_same(bank, model)
    with pytest.raises(BankIOError) as err:
        bank.compact()
    assert str(path) in str(err.value) and generations(path) == {"base-0", "log-0.oplog"}  # nothing half-written
    assert_same(bank, model)
    assert_same(MemoryBank.open(path, "r"), model)  # readers open while the disk is full
    bank.close()
    bank = MemoryBank.open(path, "rw")  # and so does the writer, which still cannot append
    assert_same(bank, model)
    with pytest.raises(BankIOError):
        for op in ops[acked:]:
            bank.apply(op)
            acked += 1
    model = model_after(ops, acked)
    if how == "tmpfs":
        filler.unlink()
    else:
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    for op in ops[acked:acked + 100]:  # space is back: the refused op and more go through
        bank.apply(op)
        acked += 1
    bank.compact()
    bank.apply(ops[acked])
    acked += 1
    bank.close()
    bank = MemoryBank.open(path, "r")
    assert bank.stats()["ops"] == acked
    assert_same(bank, model_after(ops, acked))
    Path(report).write_text(json.dumps({"acked": acked}))


def can_mount_tmpfs(tmp_path) -> bool:
    probe = tmp_path / "probe"
    probe.mkdir()
    return subprocess.run(["unshare", "-rm", "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)],
                          capture_output=True).returncode == 0 if shutil.which("unshare") else False


@pytest.mark.parametrize("how", ["tmpfs", "rlimit"])
def test_full_disk_is_a_bank_error_and_loses_no_acknowledged_op(tmp_path, how):
    folder, report = tmp_path / "fs", tmp_path / "report"
    folder.mkdir()
    if how == "tmpfs":
        if not can_mount_tmpfs(tmp_path):
            pytest.skip("cannot mount a tmpfs here (no user namespaces); the rlimit case still runs")
        # The child's own mount namespace, in which `folder` is an 8 MiB tmpfs.
        code = (f"import sys; sys.path.insert(0, {TESTS!r}); import test_bank_readers as t; "
                f"t.disk_full_main(*sys.argv[1:])")
        proc = subprocess.run(["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size=8m tmpfs "$1" && shift && exec "$@"',
                               "sh", str(folder), sys.executable, "-c", code, str(folder), how, str(report)],
                              capture_output=True, text=True, timeout=300)
        rc, err = proc.returncode, proc.stderr
    else:
        proc = child("disk_full_main", folder, how, report)
        err = proc.communicate(timeout=300)[1]
        rc = proc.returncode
    assert rc == 0, f"the writer failed (exit {rc}; -7 is SIGBUS):\n{err[-3000:]}"
    assert json.loads(report.read_text())["acked"] > 50
