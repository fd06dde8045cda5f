"""Compaction: fold a bank's delta into the next base generation, in the foreground or in a thread.

`build` turns a snapshot of the state (an O(1) fork) into the next generation: its base segment (on
disk written and checksummed but not committed), a native state over it, and an empty op log.
`commit` makes it the bank's: on disk the manifest rename is the commit point, so a crash before it
leaves the old generation whole (its log holds every op) and a crash after it the new one.

`MemoryBank.compact` builds and commits under the bank's write lock, and so does an automatic
compaction with `BankConfig.auto_compact_background` off. With it on, the op past the threshold
starts a `Background` job and returns: ops keep landing in the old generation (searches and forks
use it too), and their log records are also kept (a native Recorder sink). The thread builds,
replays the kept records onto the new state (logging them again in the new op log), then takes the
write lock only to replay the few that arrived meanwhile and commit; the old generation is released
after the lock. No op waits for the O(n) build, and the thread holds the GIL in short slices: rows
are read and encoded a slice at a time, and the native state is rebuilt without it (`State.rebased`).

Back-pressure (`backlog`, `wait_commit`): ops can come faster than builds (a build inserts each delta
row into a graph; an op costs microseconds), and each commit then leaves the ops made during its build
as the next delta, larger each time. So once the job has more than BankConfig.auto_compact_limit rows
or ops to catch up on, an op waits (outside the write lock, at most auto_compact_wait_s) until it has
committed. The job's work is then fixed: its build, the records kept so far, and under the lock at
most the limit plus one batch; it always commits. `close()` starts no further job (`auto`), so it
waits for at most the one in flight.

What a build costs beyond the changed rows: a row the old base still holds keeps its Memory object,
its vector is copied from the old base's file to the new one in the kernel (CarriedVectors), its
norm is carried (State.rebased, which still touches each page of the new mapping once), and its
graph node is carried over (graph.py); the files are still written, checksummed and synced whole,
the vectors' while the graphs are built.
"""
import threading
import time
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np

from memr1.memory_store import _core
from memr1.memory_store.errors import BankBusy, BankError, BankIOError
from memr1.memory_store.schema import FORMAT, VERSION, BankConfig, Manifest, Memory, new_bank_id, replay
from memr1.memory_store.segment import RowIndex, Segment, memory_segment
from memr1.memory_store.segment_io import CarriedVectors
from memr1.memory_store.storage import (check_lock, commit_generation, discard_generation, open_generation,
                                        prepare_generation, remove_stale)

ROWS_PER_SLICE = 4096  # rows turned into Python objects per GIL hold while the snapshot is copied


class GraphWork(NamedTuple):
    """Graph builds summed (graph.GraphCheck): the rows inserted and the seconds inserting them (the
    part that grows with the rows a compaction folds), saving the graphs and checking them (with their
    repairs). The rest of a compaction's time goes to the other files, the carried graph's copy and the
    new state."""
    inserted: int = 0
    insert_s: float = 0.0
    save_s: float = 0.0
    check_s: float = 0.0

    def plus(self, checks) -> "GraphWork":
        return GraphWork(self.inserted + sum(c.inserted for c in checks), self.insert_s + sum(c.insert_s for c in checks),
                         self.save_s + sum(c.save_s for c in checks), self.check_s + sum(c.check_s for c in checks))


class Generation(NamedTuple):
    """A built, uncommitted generation."""
    manifest: Manifest
    segment: Segment
    core: object       # a native State over `segment`
    log: object        # its op log (None for banks in memory)
    started: float     # time.perf_counter() when the build began


def auto(bank) -> None:
    """After an op past the bank's threshold (under its write lock). The op is applied and logged
    whatever happens here, so a compaction the disk refused (the bank keeps its generation) is a
    warning, and the next try waits until the rows past their threshold have doubled."""
    if bank._job is not None and bank._job.thread.is_alive():
        return  # one at a time: the running one replays this op (a job whose thread is gone: a forked copy)
    if bank._closing:
        return  # close() waits for the job in flight only; the log holds every op
    if bank.path is not None:
        check_lock(bank.path, bank._lock_fd)  # a build writes into the folder: it must still be this bank's
    if bank.config.auto_compact_background:
        bank._job = Background(bank)
        return
    try:
        gen = build(bank._core.fork(), bank.config, bank.path, bank._manifest, bank._segment)
        old = commit(bank, gen)
    except BankIOError as e:
        failed(bank, e)
        report_failure(bank)
    else:
        old = None  # the op pays for the release too
        finished(bank, gen)


def failed(bank, error: BaseException) -> None:
    """Under the write lock: the bank's next write reports `error`; the next try waits for twice the rows
    of each count past its threshold."""
    bank._job, bank._failed = None, error
    rows = (bank._core.delta_len, bank._core.base_dead)
    bank._compact_at = tuple(2 * n if n > at else at for n, at in zip(rows, bank._compact_at))


def report_failure(bank) -> None:
    """A failed automatic compaction, reported once: a warning when the disk refused it, else raised."""
    e, bank._failed = bank._failed, None
    if not isinstance(e, BankIOError):
        raise BankError(f"automatic compaction of bank {bank.path} failed: {e!r}") from e
    warnings.warn(f"automatic compaction of bank {bank.path} failed: {e}", RuntimeWarning, stacklevel=4)


def live_rows(snap, base: Segment | None = None, base_file: Path | None = None) -> tuple[list[Memory], object, RowIndex]:
    """A state's live memories, their vectors and their RowIndex, id order (snap: a fork nobody
    writes). The records are listed once without the GIL, then turned into Python objects a slice per
    GIL hold; the RowIndex comes from native columns, not from the objects. With `base`
    (snap's base segment), a row the base holds is its Memory there (the same version: a changed row
    lives in the delta), so only the delta's rows are made. With `base_file` too (base's vectors.f32),
    the vectors are CarriedVectors: only the delta's rows are read from memory, the rest are copied
    from that file when the new base is written."""
    rows = snap.live_rows()
    index = RowIndex.of_columns(*rows.columns())
    if base is None:
        memories = []
        for start in range(0, len(rows), ROWS_PER_SLICE):
            memories += [Memory(*row) for row in rows.slice(start, start + ROWS_PER_SLICE)]
        return memories, rows.vectors(), index
    at = rows.base_rows()
    fresh = np.flatnonzero(at < 0)
    held = np.empty(len(base.memories) + 1, dtype=object)   # row -1 (the delta's) picks the None at the end
    held[:-1] = base.memories
    memories = held[at].tolist()   # in C loops, not a Python pass over the rows
    for start in range(0, len(fresh), ROWS_PER_SLICE):
        some = fresh[start:start + ROWS_PER_SLICE]
        for i, row in zip(some.tolist(), rows.tuples(some)):
            memories[i] = Memory(*row)
    if base_file is None:
        return memories, rows.vectors(), index
    return memories, CarriedVectors(base_file, at, rows.vectors(fresh)), index


def build(snap, config: BankConfig, path, previous: Manifest | None, segment: Segment | None = None) -> Generation:
    """The generation after `previous` holding `snap`'s live memories (snap: a fork nobody writes);
    on disk its graphs are carried over from `segment`, previous's base, where they can be (graph.py)."""
    started = time.perf_counter()
    on_disk = path is not None and previous is not None and segment is not None and len(segment)
    base_file = path / f"base-{previous.generation}" / "vectors.f32" if on_disk else None
    memories, vectors, index = live_rows(snap, segment, base_file)
    manifest = Manifest(FORMAT, VERSION, config, previous.generation + 1 if previous else 1, snap.next_id, snap.lsn,
                        len(memories), previous.bank_id if previous else new_bank_id())
    log = None
    if path is None:
        base = memory_segment(vectors, memories, config, index)
    else:
        manifest, built = prepare_generation(path, manifest, vectors, memories,
                                             (previous, segment) if previous and segment is not None else None, index)
        try:
            base, log = open_generation(path, manifest, config, True, memories, built)
        except BaseException:
            discard_generation(path, manifest.generation)
            raise
    return Generation(manifest, base, snap.rebased(base.vectors), log, started)


def discard(gen: Generation, path) -> None:
    if gen.log is not None:
        try:
            gen.log.close()
        except BankIOError:
            pass
    if path is not None:
        discard_generation(path, gen.manifest.generation)


def commit(bank, gen: Generation) -> tuple:
    """Make `gen` the bank's generation (the caller holds its write lock). Returns the (state, segment)
    it replaced, for the caller to drop once it has released the lock: that unmaps the old generation's
    files, whose pages the kernel then frees (tens of ms at 1e5 rows), which no op need wait for; then
    `finished`. On failure the bank keeps its own."""
    if bank.path is not None:
        try:
            check_lock(bank.path, bank._lock_fd)
            gen.log.sync()  # the ops replayed into it were durable in the old log (fsync policy permitting)
            commit_generation(bank.path, gen.manifest)
        except BaseException:
            discard(gen, bank.path)
            raise
        try:
            bank._log.close()
        except BankIOError:
            pass  # the old log's final sync failed, but the new generation already holds every op
        bank._log = gen.log
        remove_stale(bank.path, gen.manifest.generation)
    bank._manifest = gen.manifest
    old = bank._core, bank._segment
    bank._install(gen.core, gen.segment)
    bank.compactions += 1
    return old


def finished(bank, gen: Generation) -> None:
    """After commit, the replaced generation dropped: the compaction's wall time, build to release."""
    bank.compaction_seconds += time.perf_counter() - gen.started
    bank.compaction_graphs = bank.compaction_graphs.plus(gen.segment.checks)


class Background:
    """One automatic compaction in a thread. Made under the bank's write lock; until it has committed,
    the bank sends its ops' records to `recorder` (which passes them on to the bank's op log)."""

    def __init__(self, bank):
        self.recorder, self.committed = _core.Recorder(bank._log), False
        self.settled = threading.Event()  # committed or failed: what ops held back by `backlog` wait for
        args = (bank, bank._core.fork(), bank.config, bank.path, bank._manifest, bank._segment)
        self.thread = threading.Thread(target=self._run, args=args, name="memr1-compaction")
        self.thread.start()

    def _run(self, bank, snap, config, path, previous, segment) -> None:
        gen = None
        try:
            gen = build(snap, config, path, previous, segment)
            del snap
            records = self.recorder.records()
            where = f"the ops applied during the compaction of bank {path}"
            replay(gen.core, records, where, gen.log)
            with bank._write:  # ops blocked: at most the back-pressure limit and a batch are left
                replay(gen.core, self.recorder.records(len(records)), where, gen.log)
                old = commit(bank, gen)
                self.committed = True
                self.settled.set()
            old = previous = segment = None  # the old generation released outside the lock
            finished(bank, gen)
            with bank._write:
                bank._job = None
                if bank._past_threshold(bank._core):  # ops came faster than the build: go again
                    auto(bank)
        except BaseException as e:  # noqa: BLE001 - handed to the bank's next op (bank.py)
            if gen is not None and not self.committed:
                discard(gen, path)
            with bank._write:
                failed(bank, e)
        finally:
            self.settled.set()


def backlog(bank) -> Background | None:
    """Under the write lock, before an op: the running background job the op must wait for, when it
    has more rows (the delta's) or ops (kept since its snapshot) left to catch up on than the limit."""
    job = bank._job
    if job is None or job.committed:
        return None
    limit = bank.config.auto_compact_limit(bank._compact_at[0])
    if bank._core.delta_len <= limit and len(job.recorder) <= limit:
        return None
    return job


def wait_commit(bank, job: Background, deadline: float | None) -> float:
    """Outside the write lock: until `job` has committed or failed, or `deadline` (time.monotonic(); None:
    auto_compact_wait_s from now) has passed, which raises BankBusy. Returns the deadline, for the
    op's next wait should the next job be behind too."""
    if deadline is None:
        deadline = time.monotonic() + bank.config.auto_compact_wait_s
    if not job.settled.wait(max(0.0, deadline - time.monotonic())):
        limit = bank.config.auto_compact_limit(bank._compact_at[0])
        behind, waited = max(bank._core.delta_len, len(job.recorder)), bank.config.auto_compact_wait_s
        raise BankBusy(f"bank {bank.path}: the op was not applied: a background compaction with {behind} rows or "
                       f"ops to catch up on (limit {limit}, auto_compact_max_delta) did not commit within "
                       f"auto_compact_wait_s={waited} s; retry, or raise either setting")
    return deadline


def wait(job: Background | None) -> None:
    """Until `job` has committed or failed (at once in a process forked while it ran: no thread there)."""
    if job is not None and job.thread is not threading.current_thread():
        job.thread.join()
