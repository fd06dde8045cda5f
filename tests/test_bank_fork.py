"""A process forked from one holding a writable bank: its copy of the handle only reads. It never
appends to, syncs or trims the parent's log (a trim cut off the parent's later ops and made its next
apply a SIGBUS); it does not hold the parent's lock once the parent closes; to write it opens the bank
itself. And a SIGKILL in the middle of a compaction leaves exactly a prefix of the acknowledged ops."""
import multiprocessing
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from bank_crash import kill_and_recover
from bank_model import op_stream
from memr1.memory_store import BankLocked, MemoryBank, Noop, ReadOnlyBank

TESTS = Path(__file__).parent


def run_forks(mode: str, trials: int, folder) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, str(TESTS / "bank_forks.py"), mode, str(trials), str(folder)],
                         capture_output=True, text=True, timeout=600, cwd=TESTS)
    print(out.stdout, out.stderr[-3000:])
    return out


@pytest.mark.parametrize("mode", ["exit", "write"])
def test_forked_child_leaves_the_parents_log_alone(tmp_path, mode):
    out = run_forks(mode, 1, tmp_path)
    assert out.returncode == 0, f"exit status {out.returncode} (-7: SIGBUS)"
    assert "300 of 300 ops match" in out.stdout


def _child_attempts(bank, path, results):
    got = []
    try:
        bank.apply(Noop())
        got.append("wrote")
    except ReadOnlyBank as e:  # the Python handle refuses first, naming both processes (os.register_at_fork)
        got.append("refused" if f"(pid {os.getpid()}) was forked" in str(e) else str(e))
    try:
        MemoryBank.open(path, "rw").close()
        got.append("opened")
    except BankLocked:
        got.append("locked")
    try:  # past the Python handle: the native log refuses on its own after a fork
        bank._core.noop(bank._log)
        got.append("logged")
    except ReadOnlyBank:
        got.append("log refused")
    got.append(len(bank.search(op_stream(0, 1)[0].vector, 3).ids))
    results.put(got)


def test_multiprocessing_fork_child_cannot_write(tmp_path):
    path = tmp_path / "b"
    ops = op_stream(3, 120)
    bank = MemoryBank.create(path, dim=16)
    for op in ops[:20]:
        bank.apply(op)
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    worker = ctx.Process(target=_child_attempts, args=(bank, path, results))
    worker.start()
    for op in ops[20:]:
        bank.apply(op)
    got = results.get(timeout=60)
    worker.join(60)
    assert got[:3] == ["refused", "locked", "log refused"] and got[3] > 0, got
    assert worker.exitcode == 0
    assert bank.stats()["ops"] == 120
    bank.close()
    assert MemoryBank.open(path, "r").stats()["ops"] == 120


def _wait(event):
    event.wait(60)


def test_lock_ends_when_the_parent_closes_though_a_forked_child_lives(tmp_path):
    path = tmp_path / "b"
    bank = MemoryBank.create(path, dim=16)
    ctx = multiprocessing.get_context("fork")
    done = ctx.Event()
    worker = ctx.Process(target=_wait, args=(done,))
    worker.start()
    try:
        bank.close()
        again = MemoryBank.open(path, "rw")  # the child's inherited descriptor must not hold the lock
        again.apply(Noop())
        again.close()
    finally:
        done.set()
        worker.join(60)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["exit", "write"])
def test_fork_soak(tmp_path, mode):
    out = run_forks(mode, int(os.environ.get("MEMR1_SOAK_TRIALS", "5")), tmp_path)
    assert out.returncode == 0, f"exit status {out.returncode} (-7: SIGBUS)"


@pytest.mark.slow
def test_sigkill_mid_compaction_soak(tmp_path):
    # Compacting every 25 ops, the kill lands inside or between compactions; each trial checks the prefix.
    for trial in range(int(os.environ.get("MEMR1_SOAK_TRIALS", "5"))):
        path = str(tmp_path / f"b{trial}")
        MemoryBank.create(path, dim=16, hnsw_threshold=10**6).close()
        ops = op_stream(100 + trial, 2000)
        kill_and_recover(path, ops, "never", 25, random.Random(trial).uniform(0.02, 0.3)).close()
