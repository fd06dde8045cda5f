"""Processes forked beside a writer, run as a script, because a child that exits normally tears its
interpreter down, which must not happen inside the test process:
    python bank_forks.py MODE TRIALS FOLDER
MODE "exit": the child leaves at once (its copy of the handle is freed by the teardown); "write": the
child tries to write through its copy and by opening the bank, while the parent goes on writing.
Each trial then checks that the bank holds every op the parent applied, in order; one line per trial,
exit status 1 if any failed (a SIGBUS kills the script instead)."""
import os
import random
import sys

from bank_model import assert_same, model_after, op_stream
from memr1.memory_store import BankLocked, MemoryBank, Noop, ReadOnlyBank

N_OPS = 300


def child(bank: MemoryBank, path: str, mode: str) -> None:
    if mode == "write":
        try:
            bank.apply(Noop())
            os._exit(3)  # wrote into the parent's log
        except ReadOnlyBank:
            pass
        try:
            MemoryBank.open(path, "rw").close()
            os._exit(4)  # a second writer beside the parent
        except BankLocked:
            pass
        bank.search(op_stream(0, 1)[0].vector, 3)  # reading its copy is fine
    sys.exit(0)


def trial(folder: str, seed: int, mode: str) -> bool:
    ops = op_stream(seed, N_OPS)
    path = os.path.join(folder, f"{mode}-{seed}")
    bank = MemoryBank.create(path, dim=16)
    fork_at, pid = random.Random(seed).randrange(1, N_OPS // 2), None
    for i, op in enumerate(ops):
        if i == fork_at:
            pid = os.fork()
            if pid == 0:
                child(bank, path, mode)
            if mode == "exit":
                status = os.waitpid(pid, 0)[1]  # its teardown is over before the parent writes again
        bank.apply(op)
    if mode == "write":
        status = os.waitpid(pid, 0)[1]
    bank.close()
    bank = MemoryBank.open(path, "r")
    ops_held = bank.stats()["ops"]
    try:
        assert_same(bank, model_after(ops, N_OPS))
        same = True
    except AssertionError:
        same = False
    ok = status == 0 and ops_held == N_OPS and same
    print(f"{mode} trial {seed}: fork after op {fork_at}, child status {status}, {ops_held} of {N_OPS} ops "
          f"{'match' if same else 'DIFFER'}", flush=True)
    return ok


if __name__ == "__main__":
    mode, trials, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    results = [trial(folder, seed, mode) for seed in range(trials)]
    sys.exit(0 if all(results) else 1)
