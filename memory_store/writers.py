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
