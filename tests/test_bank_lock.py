"""The writer lock is a flock on the bank's folder itself: removing or replacing LOCK lets no second
writer in, and a writer whose folder was moved away and replaced commits nothing into the new one."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from memr1.memory_store import Add, BankError, BankLocked, MemoryBank

DIM = 8


def vec(i: int) -> np.ndarray:
    v = np.zeros(DIM, np.float32)
    v[i % DIM] = 1.0
    v[(i + 1) % DIM] = 0.5
    return v


def second_writer(path) -> str:
    """A second writer's open, in another process (a flock is per open file, so this process would do
    too, but another process is what a user runs)."""
    code = (f"from memr1.memory_store import MemoryBank, BankError\n"
            f"try:\n    MemoryBank.open({str(path)!r}, 'rw')\n    print('OPENED')\n"
            f"except BankError as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return out.stdout.strip()


@pytest.mark.parametrize("how", ["deleted", "replaced", "replaced-by-rename"])
def test_removing_or_replacing_lock_lets_no_second_writer_in(tmp_path, how):
    path = tmp_path / "b"
    bank = MemoryBank.create(path, dim=DIM)
    acked = [bank.apply(Add(f"m{i}", vec(i), "A")) for i in range(20)]
    lock = path / "LOCK"
    lock.unlink()
    if how == "replaced":
        lock.write_text("")
    elif how == "replaced-by-rename":
        (tmp_path / "other").write_text("1")
        os.replace(tmp_path / "other", lock)
    said = second_writer(path)
    assert said.startswith("BankLocked ") and "already open for writing" in said and "\n" not in said, said
    with pytest.raises(BankLocked):
        MemoryBank.open(path, "rw")
    acked += [bank.apply(Add(f"n{i}", vec(i), "A")) for i in range(20)]
    bank.compact()
    bank.close()
    with MemoryBank.open(path, "r") as again:
        assert sorted(m.id for m in again) == sorted(acked)
    assert second_writer(path) == "OPENED"   # closed: the next writer gets the lock


def test_a_writer_whose_folder_was_replaced_commits_nothing_there(tmp_path):
    path, moved = tmp_path / "b", tmp_path / "moved"
    bank = MemoryBank.create(path, dim=DIM)
    acked = [bank.apply(Add(f"m{i}", vec(i), "A")) for i in range(10)]
    os.rename(path, moved)
    shutil.copytree(moved, path)   # what copying a bank back over its own path makes
    before = sorted(os.listdir(path))
    with pytest.raises(BankError, match="moved or replaced") as e:
        bank.compact()
    assert "\n" not in str(e.value)
    assert sorted(os.listdir(path)) == before
    bank.close()
    assert sorted(os.listdir(path)) == before
    with MemoryBank.open(moved, "r") as kept:   # every acked op is in the folder it was logged to
        assert sorted(m.id for m in kept) == sorted(acked)
    assert second_writer(path) == "OPENED"
