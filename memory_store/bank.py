"""MemoryBank: the public API over the native core, the base segment and the op log.

A bank on disk is a folder:
    MANIFEST.json          format, version, config, generation, next id, op count
    base-<gen>/            the immutable base segment (segment.py)
    log-<gen>.oplog        ops applied since that base, one checksummed record each (native)
    LOCK                   the writer's pid (the writer's lock is a flock on the folder itself)
compact() writes base-<gen+1> and an empty log-<gen+1>, then swaps MANIFEST.json by rename; a crash at
any point leaves the old or the new generation whole, and the next writer removes the other. Readers
(mode="r") take a lease on their generation while they open it (storage.py), and copy the log rather
than map it, so a writer that compacts, closes or deletes an old generation never breaks a reader.

A writable bank (not a fork, not a reader) compacts itself after an op past BankConfig.auto_compact_*.
Threads: writes take the bank's lock, so no op lands in a state that a compaction is replacing; searches
take none and run without the GIL, reading (state, segment) as one pair: HNSW candidates always index
the base they were found in. Automatic compaction runs in a background thread by default (compaction.py).
Processes: a process forked from one holding a writable bank gets a read-only copy of the handle
(writers.py); to write, it opens the bank itself, and gets the lock once the parent has closed.
"""
import os
import threading
import warnings
from pathlib import Path
from typing import Iterable, Iterator

import msgspec
import numpy as np

from memr1.memory_store import _core, compaction
from memr1.memory_store.errors import BankError, UnknownMemoryId
from memr1.memory_store.inputs import bulk_rows, check_k, check_open, check_search, iter_ops, make_config
from memr1.memory_store.schema import (FORMAT, VERSION, Add, BankConfig, Delete, Manifest, Memory, Noop, Update, apply_op,
                                        new_bank_id, replay)
from memr1.memory_store.segment import SearchResult, Segment, memory_segment, state_over
from memr1.memory_store.storage import (as_path, check_lock, clear_partial, leased, lock, new_folder, open_generation,
                                        read_manifest, remove_stale, unlock, write_generation)
from memr1.memory_store.writers import write_refusal, writers

_NEVER = 1 << 62  # the compaction threshold of banks that never compact on their own


class MemoryBank:
    """Use `create`, `open`, `from_arrays` or `fork`; the constructor is internal."""

    def __init__(self, core, config: BankConfig, segment: Segment, path: Path | None = None,
                 manifest: Manifest | None = None, log=None, read_only: bool = False, lock_fd: int | None = None,
                 auto_compact: bool = False):
        self.config, self.path, self._manifest, self._log = config, path, manifest, log
        self.read_only, self._lock_fd, self._closed, self._closing = read_only, lock_fd, False, False
        self._write, self._auto = threading.RLock(), auto_compact
        self._batching, self._owner, self._forked_from = False, os.getpid() if lock_fd is not None else None, None
        self.compactions = 0  # by this object, automatic or not
        self.compaction_seconds = 0.0  # their wall time, build to commit (in a thread or in the op)
        self.compaction_graphs = compaction.GraphWork()  # their graphs' rows inserted, seconds inserting, ...
        self._job, self._failed = None, None  # a background compaction in flight (compaction.py); one that failed
        self._install(core, segment)
        if lock_fd is not None:
            writers.add(self)

    def _install(self, core, segment: Segment) -> None:
        self._core, self._segment, self._view = core, segment, (core, segment)
        at = self.config.auto_compact_thresholds(core.base_size) if self._auto else None
        self._compact_at = (_NEVER, _NEVER) if at is None else at  # (delta rows, dead base rows)

    def _past_threshold(self, core) -> bool:
        return core.delta_len > self._compact_at[0] or core.base_dead > self._compact_at[1]

    # ---- construction ----
    @classmethod
    def create(cls, path: str | os.PathLike | None, dim: int | None = None, config: BankConfig | None = None,
               **overrides) -> "MemoryBank":
        """A new empty bank at `path` (which must not exist), or in memory when path is None."""
        empty = np.empty((0, make_config(dim, config, overrides).dim), np.float32)
        return cls.from_arrays(path, empty, [], [], [], dim=dim, config=config, **overrides)

    @classmethod
    def from_arrays(cls, path, vectors: np.ndarray, texts: list[str], speakers: list[str], timestamps: list[str],
                    dim: int | None = None, config: BankConfig | None = None, **overrides) -> "MemoryBank":
        """Bulk-load rows as one base segment (ids 0..n-1), without logging them op by op."""
        config, vectors, memories = bulk_rows(vectors, texts, speakers, timestamps, dim, config, overrides)
        manifest = Manifest(FORMAT, VERSION, config, 0, len(memories), len(memories), len(memories), new_bank_id())
        if path is None:
            return cls._assemble(config, memory_segment(vectors, memories, config), manifest)
        return cls._write_new(path, manifest, vectors, memories, "create a bank at")

    @classmethod
    def _write_new(cls, path, manifest: Manifest, vectors, memories, doing: str) -> "MemoryBank":
        """A new bank at `path`, open for writing. It is written under the writer lock that the open
        keeps: a create killed before its manifest leaves a folder that no open reads and that the next
        create clears (no other create is writing it then)."""
        path = new_folder(path, doing)
        lock_fd = lock(path)
        try:
            clear_partial(path, doing)
            write_generation(path, manifest, vectors, memories)
            return cls._load(path, read_manifest(path), None, lock_fd)
        except BaseException:
            unlock(lock_fd)
            raise

    @classmethod
    def open(cls, path: str | os.PathLike, mode: str = "rw", fsync: str | None = None) -> "MemoryBank":
        """Open an existing bank. mode "rw" takes the writer lock; "r" reads a snapshot and never writes."""
        check_open(mode, fsync)
        path = as_path(path)
        manifest = read_manifest(path)  # before LOCK is created: the folder must be a bank
        if mode == "rw":
            lock_fd = lock(path)
            try:
                manifest = read_manifest(path)  # a writer that just closed may have compacted meanwhile
                remove_stale(path, manifest.generation)
                return cls._load(path, manifest, fsync, lock_fd)
            except BaseException:
                unlock(lock_fd)
                raise
        with leased(path, manifest) as manifest:
            return cls._load(path, manifest, fsync, None)

    @classmethod
    def _load(cls, path: Path, manifest: Manifest, fsync: str | None, lock_fd: int | None) -> "MemoryBank":
        config = manifest.config if fsync is None else msgspec.structs.replace(manifest.config, fsync=fsync)
        writer = lock_fd is not None
        segment, log = open_generation(path, manifest, config, writer)  # the log's bank and generation checked
        try:
            bank = cls._assemble(config, segment, manifest, path, log if writer else None, not writer, lock_fd, writer)
            replay(bank._core, log.payloads(), path)
        except BaseException:
            log.close()
            raise
        if log.torn_record:
            warnings.warn(f"bank {path}: the last record of its op log ({log.torn_record} bytes) was torn by a "
                          f"crash or power loss before it was synced, and is dropped", RuntimeWarning, stacklevel=3)
        if not writer:
            log.close()  # the snapshot is built; a reader keeps no copy of the log
        return bank

    @classmethod
    def _assemble(cls, config, segment, manifest, path=None, log=None, read_only=False, lock_fd=None, auto=True):
        return cls(state_over(config, segment, manifest), config, segment, path, manifest, log, read_only, lock_fd,
                   auto)

    # ---- operations ----
    def apply(self, op: Add | Update | Delete | Noop) -> int | None:
        """Apply one op, durably logged before returning. Returns the memory id (None for Noop). Waits
        (BankConfig.auto_compact_max_delta, auto_compact_wait_s) while a background compaction is too
        far behind; BankBusy if it stays so."""
        deadline = None
        while True:
            with self._write:
                self._check_writable()
                if self._job is None or (job := compaction.backlog(self)) is None:
                    out = apply_op(self._core, self._sink(), op)
                    if self._auto and self._past_threshold(self._core):  # a fork never compacts on its own
                        compaction.auto(self)
                    return out
            deadline = compaction.wait_commit(self, job, deadline)  # without the lock, which the job needs

    def apply_batch(self, ops: Iterable[Add | Update | Delete | Noop]) -> list[int | None]:
        """All or nothing: the ops run on an O(1) fork, which replaces this state only if all succeed.
        Waits before the batch as `apply` does."""
        deadline = None
        while True:
            with self._write:
                self._check_writable()
                if self._job is None or (job := compaction.backlog(self)) is None:
                    return self._apply_batch(ops)
            deadline = compaction.wait_commit(self, job, deadline)

    def _apply_batch(self, ops) -> list[int | None]:
        """apply_batch, under the write lock."""
        ops = iter_ops(ops)
        child = MemoryBank(self._core.fork(), self.config, self._segment)
        sink = self._sink()
        buffer = _core.BatchBuffer() if sink is not None else None
        child._log = buffer
        results = []
        self._batching = True  # the ops may be a generator that writes to this bank: refused
        try:
            for i, op in enumerate(ops):
                try:
                    results.append(child.apply(op))
                except BankError as e:
                    e.add_note(f"apply_batch: op {i} ({type(op).__name__}) failed; no op of the batch was applied")
                    raise
        finally:
            self._batching = False
        if buffer is not None and len(buffer):
            sink.put_batch(buffer)
        self._core, self._view = child._core, (child._core, self._segment)
        if self._past_threshold(child._core):
            compaction.auto(self)
        return results

    def _sink(self):
        """Where an op's record goes: the op log, or a background compaction's recorder until it commits."""
        return self._job.recorder if self._job is not None and not self._job.committed else self._log

    def wait_for_compaction(self) -> None:
        """Return once no background compaction of this bank is in flight (each has committed or failed;
        one that found the bank past its threshold again has started the next)."""
        while (job := self._job) is not None:
            compaction.wait(job)
            with self._write:
                if self._job is job:
                    self._job = None  # a job inherited by a forked process: its thread does not exist here

    def _check_writable(self) -> None:
        if self.read_only or self._closed or self._closing or self._batching:
            raise write_refusal(self)
        if self._failed is not None:
            compaction.report_failure(self)

    # ---- reads ----
    def search(self, vector: np.ndarray, k: int = 10, speaker: str | None = None, exact: bool = False) -> SearchResult:
        """Top-k live memories by cosine similarity, reflecting every applied op."""
        k = check_search(k, speaker)
        core, segment = self._view
        segment.check_mapped()
        rows, graphs = (None, []) if exact else segment.plan(speaker)
        ids, scores = core.search(vector, k, speaker, rows, graphs, int(k * self.config.hnsw_oversample))
        return SearchResult(ids, scores)

    def get(self, memory_id: int) -> Memory:
        row = self._core.get(memory_id)
        if row is None:
            raise UnknownMemoryId(memory_id)
        return Memory(*row)

    def __contains__(self, memory_id: int) -> bool:
        return self._core.contains(memory_id)

    def __len__(self) -> int:
        return self._core.size

    def __iter__(self) -> Iterator[Memory]:
        return (Memory(*row) for row in self._core.live())

    def items_for_prompt(self, vector: np.ndarray | None = None, k: int | None = None,
                         speaker: str | None = None) -> list[tuple[int, str, str]]:
        """(id, text, timestamp) rows: the top-k for `vector`, or every live memory in id order."""
        k = None if k is None else check_k(k)
        if vector is None:
            rows = [(m.id, m.text, m.timestamp) for m in self if speaker is None or m.speaker == speaker]
            return rows if k is None else rows[:k]
        ids, _ = self.search(vector, len(self) if k is None else k, speaker)
        return [(m.id, m.text, m.timestamp) for m in map(self.get, ids.tolist())]

    # ---- forks, compaction, persistence ----
    def fork(self) -> "MemoryBank":
        """O(1) copy-on-write child in memory; its ops never show in this bank or its siblings."""
        core, segment = self._view  # one pair, should another thread compact meanwhile
        return MemoryBank(core.fork(), self.config, segment)

    def compact(self) -> None:
        """Fold the delta into a new base (the one O(n) step) now, after any background compaction in flight.
        Ids stay the same; searches in other threads meanwhile see the old state, and the new one whole."""
        while True:
            self.wait_for_compaction()
            with self._write:
                if self._job is None:  # else another thread's op started one meanwhile
                    self._check_writable()
                    if self.path is not None:
                        check_lock(self.path, self._lock_fd)  # the build writes into the folder
                    gen = compaction.build(self._core.fork(), self.config, self.path, self._manifest, self._segment)
                    old = compaction.commit(self, gen)
                    break
        del old  # the old generation, released outside the lock
        compaction.finished(self, gen)

    def save(self, path: str | os.PathLike) -> "MemoryBank":
        """Write this bank (a fork included) as a bank of its own at a new path, and open it."""
        core = self._core.fork()  # one state for both reads, whatever other threads apply meanwhile
        memories, vectors, _ = compaction.live_rows(core)
        return MemoryBank._write_new(path, Manifest(FORMAT, VERSION, self.config, 0, core.next_id, core.lsn,
                                                    len(memories), new_bank_id()), vectors, memories, "save a bank to")

    def sync(self) -> None:
        with self._write:
            if self._log is not None and not self.read_only:
                self._log.sync()

    def close(self) -> None:
        """A background compaction in flight commits first; none starts after it (compaction.auto), so
        close waits for at most one, whose catch-up back-pressure bounds. From its first line on, an op
        from another thread is refused unapplied (BankError, "closing"), so none lands during the wait."""
        with self._write:
            if self._batching:  # before waiting: the job in flight would wait for this thread's lock
                raise write_refusal(self)
            self._closing = True
        self.wait_for_compaction()
        with self._write:
            if self._closed:
                return
            if self._batching:
                raise write_refusal(self)
            self._closed = True
            writers.discard(self)
            try:
                if self._log is not None:
                    self._log.close()
                if self._lock_fd is not None:
                    try:
                        check_lock(self.path, self._lock_fd)  # never clean a folder that replaced ours
                    except BankError:
                        pass  # the ops are in our folder's log, wherever it was moved
                    else:
                        remove_stale(self.path, self._manifest.generation)  # generations readers held
            finally:
                if self._lock_fd is not None:
                    unlock(self._lock_fd)
                    self._lock_fd = None

    def __enter__(self) -> "MemoryBank":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def dim(self) -> int:
        return self.config.dim

    def stats(self) -> dict:
        c, segment = self._view
        return {"live": c.size, "base_rows": c.base_size, "delta_rows": c.delta_len, "base_dead": c.base_dead,
                "next_id": c.next_id, "ops": c.lsn, "hnsw_speakers": sorted(segment.graphs)}

    @property
    def compacting(self) -> bool:
        """A background compaction is in flight (searches and ops use the current generation meanwhile)."""
        return self._job is not None

    @property
    def auto_compact_at(self) -> int | None:
        """An op compacts once delta_rows (stats) exceed this, or base_dead auto_compact_dead_at; None: never."""
        return None if self._compact_at[0] == _NEVER else self._compact_at[0]

    @property
    def auto_compact_dead_at(self) -> int | None:
        return None if self._compact_at[1] == _NEVER else self._compact_at[1]
