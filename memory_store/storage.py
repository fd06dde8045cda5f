"""The bank's folder on disk: paths, generations, the manifest, the writer lock, reader leases.

MANIFEST.json is the commit point: a generation (base-<gen>/ + log-<gen>.oplog) exists for readers only
once the manifest that names it has been renamed into place.

Reader leases. A reader reads the manifest, then opens the files of the generation it names; the
writer may meanwhile commit a newer generation and delete that one. So a reader holds a shared flock
on the folder base-<gen>/ while it opens that generation's files, and the writer deletes an old
generation only under an exclusive, non-blocking flock on the same folder: a generation being opened
is skipped and deleted by a later remove_stale. Once open, a reader needs no lease: it holds the
segment files mapped (deleting a file never truncates it) and has copied the log.
"""
import errno
import fcntl
import os
import shutil
import stat
from contextlib import contextmanager
from pathlib import Path

import msgspec

from memr1.memory_store import _core
from memr1.memory_store.errors import BankError, BankFormatError, BankIOError, BankLocked, InvalidInput
from memr1.memory_store.manifest import read_manifest, write_manifest
from memr1.memory_store.schema import BankConfig, Manifest
from memr1.memory_store.segment import Previous, open_segment, write_segment
from memr1.memory_store.segment_io import fsync_path

SYNC = {"never": 0, "op": 1, "every_n": 2, "close": 3}  # the fsync policies' codes in the native OpLog
_OPEN_TRIES = 100  # generations a reader may see replaced under it while opening before it gives up


def as_path(path) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidInput(f"path must be a str or os.PathLike, got {type(path).__name__}")
    path = Path(path)
    if "\0" in str(path):
        raise InvalidInput(f"path {str(path)!r} holds a NUL character")
    return path


# What a create (or save) writes before its manifest: a folder holding only these is one a killed create
# left, which no open reads (no MANIFEST.json), and a create takes it over rather than refusing it.
_CREATE_FILES = frozenset({"LOCK", "MANIFEST.json.tmp", "base-0", "base-0.tmp", "log-0.oplog"})


def _left_by_create(path: Path) -> bool:
    return all(entry.name in _CREATE_FILES for entry in path.iterdir())


def new_folder(path, doing: str) -> Path:
    """`path` as a folder to write a new bank in: made if missing, empty, or left by a killed create
    (which `clear_partial` empties under the writer lock); BankError if it holds anything else."""
    path = as_path(path)
    try:
        if path.exists() and (not path.is_dir() or not _left_by_create(path)):
            raise BankError(f"cannot {doing} {path}: it already exists and is not an empty folder")
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BankIOError(f"cannot {doing} {path}: {e.strerror or e}", e.errno or 0) from None
    return path


def clear_partial(path: Path, doing: str) -> None:
    """Under the writer lock: remove what a killed create left in `path` (new_folder let it through);
    BankError if another create finished there meanwhile or put anything else in it."""
    try:
        if not _left_by_create(path):
            raise BankError(f"cannot {doing} {path}: it already exists and is not an empty folder")
        for entry in path.iterdir():
            if entry.name != "LOCK":
                _remove(entry)
    except OSError as e:
        raise BankIOError(f"cannot {doing} {path}: {e.strerror or e}", e.errno or 0) from None


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        entry.unlink(missing_ok=True)


def write_generation(path: Path, manifest: Manifest, vectors, memories) -> Manifest:
    """Write base-<gen>/, an empty log-<gen>.oplog and the manifest that commits them. On failure (a
    full disk) nothing is committed and this call's files are removed, so the bank keeps its old state."""
    manifest, _ = prepare_generation(path, manifest, vectors, memories)
    commit_generation(path, manifest)
    return manifest


def prepare_generation(path: Path, manifest: Manifest, vectors, memories, previous: tuple | None = None,
                       index=None) -> tuple:
    """Write base-<gen>/ and an empty log-<gen>.oplog, not committed yet; returns the manifest that
    commits them (with the segment's files), and the segment's native graphs with what building them
    took and the rows' RowIndex (`index`, if given; for open_generation).
    `previous`: (the generation's manifest, its segment), whose graphs the new ones are carried over
    from where they can be. On failure this call's files are removed (BankIOError)."""
    gen = manifest.generation
    try:
        before = None
        if previous is not None and previous[0].speakers_indexed:
            old, segment = previous
            before = Previous(path / f"base-{old.generation}", old.speakers_indexed, segment)
        speakers, files, orphans, graphs, checks = write_segment(path / f"base-{gen}", vectors, memories, manifest.config,
                                                                 before, index)
        log = path / f"log-{gen}.oplog"
        log.unlink(missing_ok=True)  # a leftover of an interrupted compaction to this generation
        _core.OpLog.create(str(log), gen, manifest.bank_id)
    except Exception as e:
        discard_generation(path, gen)
        if not isinstance(e, OSError):  # BankIOError is one
            raise
        raise BankIOError(f"bank {path}: cannot write generation {gen}: {e.strerror or e}; the bank is "
                          f"unchanged", e.errno or 0) from None
    return msgspec.structs.replace(manifest, speakers_indexed=speakers, files=files, graph_orphans=orphans), (graphs, checks, index)


def commit_generation(path: Path, manifest: Manifest) -> None:
    """The commit point: the manifest naming a prepared generation, renamed into place and synced. On a
    failure before the rename the generation's files are removed and the bank is unchanged."""
    try:
        write_manifest(path, manifest)
    except OSError as e:
        discard_generation(path, manifest.generation)
        raise BankIOError(f"bank {path}: cannot commit generation {manifest.generation}: {e.strerror or e}; "
                          f"the bank is unchanged", e.errno or 0) from None
    try:
        fsync_path(path)
    except OSError as e:
        raise BankIOError(f"bank {path}: cannot sync its folder: {e.strerror}", e.errno or 0) from None


def discard_generation(path: Path, gen: int) -> None:
    """Remove an uncommitted generation's files."""
    for leftover in (path / f"base-{gen}.tmp", path / f"base-{gen}", path / f"log-{gen}.oplog",
                     path / "MANIFEST.json.tmp"):
        _remove(leftover)


def open_generation(path: Path, manifest: Manifest, config: BankConfig, writable: bool, memories=None,
                    built=None) -> tuple:
    """The manifest's generation: (segment, op log). `config` is the manifest's, or it with another fsync;
    `memories` and `built`: the segment's rows, and its native graphs with what building them took (as
    prepare_generation returns them), when the caller just wrote them (not read back)."""
    gen = manifest.generation
    graphs, checks, index = built if built is not None else (None, (), None)
    segment = open_segment(path / f"base-{gen}", config, manifest.speakers_indexed, manifest.base_rows,
                           manifest.files, memories, manifest.graph_orphans, graphs, checks, index)
    return segment, _core.OpLog(str(path / f"log-{gen}.oplog"), writable, SYNC[config.fsync], config.fsync_every,
                                gen, manifest.bank_id)


def lock(path: Path) -> int:
    """The writer lock: an exclusive flock on the bank's folder itself. A lock on a file inside it would
    go with that file's removal or replacement, letting a second writer in. LOCK holds only the
    writer's pid, for the message another writer gets."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise BankIOError(f"cannot open {path}: {e.strerror}", e.errno or 0) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise BankLocked(f"bank {path} is already open for writing (by pid {_holder(path)}); "
                         f"open it with mode='r' to read alongside") from None
    except OSError as e:
        os.close(fd)
        raise BankIOError(f"cannot lock {path}: {e.strerror}", e.errno or 0) from None
    try:
        _write_pid(path / "LOCK")
    except BaseException:
        unlock(fd)
        raise
    return fd


def _open_lock_file(file: Path, flags: int) -> int:
    try:  # never through a symlink (the pid would be written to its target), never waiting on a FIFO
        fd = os.open(file, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        kind = {errno.EISDIR: "a directory", errno.ELOOP: "a symlink", errno.ENXIO: "a socket or FIFO"}.get(e.errno)
        if kind:
            raise BankFormatError(f"{file} is {kind}; a bank's LOCK must be a regular file") from None
        raise BankIOError(f"cannot open {file}: {e.strerror}", e.errno or 0) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BankFormatError(f"{file} is not a regular file; a bank's LOCK must be one")
    return fd


def _write_pid(file: Path) -> None:
    fd = _open_lock_file(file, os.O_RDWR | os.O_CREAT)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
    except OSError:
        pass  # the pid only improves the message another writer gets; a full disk must not stop an open
    finally:
        os.close(fd)


def _holder(path: Path) -> str:
    try:
        fd = _open_lock_file(path / "LOCK", os.O_RDONLY)
    except BankError:
        return "unknown"
    try:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    except OSError:
        return "unknown"
    finally:
        os.close(fd)


def check_lock(path: Path, fd: int) -> None:
    """BankError unless `path` is still the folder the writer lock `fd` holds: a folder moved away and
    another put in its place must not get this writer's commits (nor lose its files to remove_stale)."""
    held = os.fstat(fd)
    try:
        now = os.stat(path)
    except OSError:
        now = None
    if now is None or (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
        raise BankError(f"bank {path} was moved or replaced since this writer opened it; nothing more is "
                        f"committed there: reopen the bank")


def unlock(fd: int) -> None:
    """Release the writer lock explicitly: a forked child may still hold a copy of the descriptor, and
    merely closing ours would leave the lock held until every copy is closed."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def lease(path: Path, generation: int) -> int | None:
    """A reader's shared lease on a generation (see the module doc), or None when it is gone."""
    try:
        fd = os.open(path / f"base-{generation}", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise BankFormatError(f"{path / f'base-{generation}'} is a symlink, not a folder: the bank is damaged") from None
        raise BankIOError(f"cannot open {path / f'base-{generation}'}: {e.strerror}", e.errno or 0) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits while a writer is deleting it
    except OSError as e:
        os.close(fd)
        raise BankIOError(f"cannot lock {path / f'base-{generation}'}: {e.strerror}", e.errno or 0) from None
    if os.fstat(fd).st_nlink == 0:  # deleted before we got the lease
        os.close(fd)
        return None
    return fd


@contextmanager
def leased(path: Path, manifest: Manifest):
    """Hold a reader lease on the newest generation while the caller opens it; yields its manifest."""
    for _ in range(_OPEN_TRIES):
        held = lease(path, manifest.generation)
        if held is not None:
            try:
                yield manifest
            finally:
                os.close(held)
            return
        newer = read_manifest(path)
        if newer.generation == manifest.generation:
            raise BankFormatError(f"{path / f'base-{manifest.generation}'} is missing or not a folder: the bank is damaged")
        manifest = newer  # the writer committed a newer generation and deleted this one meanwhile
    raise BankError(f"bank {path} was compacted {_OPEN_TRIES} times while a reader opened it; try again")


def remove_stale(path: Path, generation: int) -> None:
    """Drop files of other generations: leftovers of a compaction that crashed, or generations a
    compaction replaced. One that a reader is opening is kept, and so is one that cannot be removed
    now (permissions): a later call (each open, compaction and close of the writer) tries again."""
    keep = {f"base-{generation}", f"log-{generation}.oplog", "MANIFEST.json", "LOCK"}
    leased = set()
    try:
        entries = sorted(path.iterdir())  # base-* before log-*
    except OSError:
        return
    for entry in entries:
        name = entry.name
        if name in keep or not name.startswith(("base-", "log-", "MANIFEST.json.")):
            continue
        gen = name.partition("-")[2].split(".", 1)[0]  # "" for MANIFEST.json.tmp
        try:
            if name.startswith("base-") and entry.is_dir() and not name.endswith(".tmp"):
                fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    # both files go under the lock: a reader's lease on base-<gen> covers its log too
                    (path / f"log-{gen}.oplog").unlink(missing_ok=True)
                    shutil.rmtree(entry)
                finally:
                    os.close(fd)
            elif not (name.startswith("log-") and gen in leased):
                _remove(entry)
        except OSError:  # BlockingIOError: a reader holds its lease
            leased.add(gen)
