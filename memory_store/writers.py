"""The writable banks open in this process, and what a fork makes of them.

A forked child shares the parent's op log (file and mapping) and its lock's open file description. Were
the child's copy of a handle to write, the log would interleave two writers' records; were it to close
normally, it would trim the log to its own length and the parent's next append would fault (SIGBUS).
So in the child each such bank becomes a read-only snapshot, and the native OpLog refuses to append,
sync or trim after a fork on its own as well (it also sees forks that bypass os.fork).
"""
import os
import threading
import weakref

from memr1.memory_store.errors import BankError, ReadOnlyBank

writers = weakref.WeakSet()  # MemoryBank objects holding the writer lock


def _after_fork() -> None:
    """Closing the child's copy of the lock descriptor keeps a long-lived child from holding the lock
    (the parent also releases it explicitly on close: storage.unlock)."""
    for bank in list(writers):
        bank._write = threading.RLock()  # a parent thread may have held it at the fork
        bank.read_only, bank._forked_from = True, bank._owner
        if bank._lock_fd is not None:
            os.close(bank._lock_fd)
            bank._lock_fd = None
    writers.clear()


os.register_at_fork(after_in_child=_after_fork)


def write_refusal(bank) -> BankError:
    """Why `bank` may not be written now, as the error to raise."""
    if bank._batching:
        return BankError(f"bank {bank.path}: a write from inside its own apply_batch (the ops iterable wrote "
                         f"to the bank); write after apply_batch returns")
    if bank._closed:
        return BankError(f"bank {bank.path} is closed")
    if bank._closing:
        return BankError(f"bank {bank.path} is closing (close() was called): the op was not applied")
    if bank._forked_from is not None:
        return ReadOnlyBank(f"bank {bank.path} was opened for writing by pid {bank._forked_from}; this process "
                            f"(pid {os.getpid()}) was forked from it and may only read this handle: open the "
                            f"bank again here to write")
    return ReadOnlyBank(f"bank {bank.path} was opened read-only (mode='r'); open it with mode='rw' to write")
