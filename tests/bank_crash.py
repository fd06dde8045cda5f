"""A writer killed at a random instant: apply ops in a forked child, SIGKILL it, reopen and check the bank."""
import os
import signal
import time

from bank_model import assert_same, model_after
from memr1.memory_store import MemoryBank


def run_child(path: str, ops, fsync: str, ack_fd: int, compact_every: int) -> None:
    """In a forked child: apply ops, acknowledge each after apply() returns, compact now and then."""
    try:
        bank = MemoryBank.open(path, "rw", fsync=fsync)
        for i, op in enumerate(ops):
            bank.apply(op)
            os.write(ack_fd, b".")
            if i % compact_every == compact_every - 1:
                bank.compact()
        bank.close()
    finally:
        os._exit(0)


def kill_and_recover(path: str, ops, fsync: str, compact_every: int, wait: float) -> MemoryBank:
    """Apply `ops` in a forked child, SIGKILL it after `wait` seconds, reopen the bank and check that it
    holds exactly a prefix of the ops: every acknowledged one, and at most the one in flight besides."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        run_child(path, ops, fsync, w, compact_every)
    os.close(w)
    time.sleep(wait)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    acked = 0
    while chunk := os.read(r, 4096):
        acked += len(chunk)
    os.close(r)
    bank = MemoryBank.open(path, "rw")
    p = bank.stats()["ops"]
    print(f"fsync={fsync}: {acked} acknowledged, {p} recovered, generation {bank._manifest.generation}")
    assert acked <= p <= min(acked + 1, len(ops)), (acked, p)
    assert_same(bank, model_after(ops, p))
    return bank
