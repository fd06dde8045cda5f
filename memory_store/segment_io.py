"""A segment's files as bytes on disk: reading one safely, encoding the records, writing the vectors
(whole, or carried over from the base before in the kernel), and settling each file (its CRC32C once it
is synced), in a thread of its own while the graphs are built. Used by segment.py and storage.py."""
import errno
import os
import stat
import threading
from pathlib import Path
from typing import NamedTuple

import msgspec
import numpy as np

from memr1.memory_store import _core
from memr1.memory_store.errors import BankFormatError
from memr1.memory_store.schema import Memory

_encoder = msgspec.msgpack.Encoder()


class CarriedVectors(NamedTuple):
    """A compaction's new base rows, most of them rows of the base before: `rows[i]` is new row i's row
    in `source` (that base's vectors.f32), or -1 for a row from the delta, whose vectors `delta` holds
    in order. Written by copying runs of rows from file to file in the kernel, not through memory."""
    source: Path
    rows: np.ndarray
    delta: np.ndarray


def fsync_path(path: Path) -> None:
    """fsync a file, or a folder (which makes the renames and creations in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_regular(path: Path, limit: int) -> bytes:
    """A regular file's bytes, never through a symlink and never waiting on a FIFO; BankFormatError,
    before anything is read, when it holds more than `limit` bytes (what the caller knows it may hold)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BankFormatError(f"{path} is not a regular file")
        if st.st_size > limit:
            raise BankFormatError(f"{path} is {st.st_size} bytes, more than the {limit} it may hold: it is damaged")
        chunks, left = [], limit + 1  # one byte past the limit shows a file that grew meanwhile
        while left and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        if not left:
            raise BankFormatError(f"{path} grew past the {limit} bytes it may hold while it was read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def encode_memories(memories: list[Memory], rows_per_call: int = 8192) -> bytes:
    """msgspec's msgpack encoding of `memories` (a list), built from slices so that a background
    compaction holds the GIL for one slice at a time: the array header, then each slice's elements."""
    n = len(memories)
    head = bytes([0x90 | n]) if n < 16 else (b"\xdc" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdd" + n.to_bytes(4, "big"))
    parts = [head]
    for start in range(0, n, rows_per_call):
        part = _encoder.encode(memories[start:start + rows_per_call])
        m = min(rows_per_call, n - start)
        parts.append(part[1 if m < 16 else 3 if m < 1 << 16 else 5:])  # without the slice's own header
    return b"".join(parts)


def copy_range(src: int, dst: int, src_at: int, dst_at: int, count: int) -> None:
    """`count` bytes from file `src` at `src_at` to file `dst` at `dst_at`: in the kernel where it can
    (copy_file_range), else through a buffer."""
    while count:
        done = 0
        if hasattr(os, "copy_file_range"):
            try:
                done = os.copy_file_range(src, dst, count, src_at, dst_at)
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                    raise
        if not done:
            data = os.pread(src, min(count, 1 << 24), src_at)
            if not data:
                raise OSError(errno.EIO, f"file ends {count} bytes short of the rows to copy")
            done = os.pwrite(dst, data, dst_at)
        src_at, dst_at, count = src_at + done, dst_at + done, count - done


def write_carried(dst: int, carried: CarriedVectors, row_bytes: int) -> None:
    """The new base's vectors into `dst`: each run of rows that follow each other in the old base
    copied with one call, each run of delta rows written with one."""
    rows = np.asarray(carried.rows, np.int64)
    fresh = rows < 0
    starts = np.ones(len(rows), bool)
    starts[1:] = (fresh[1:] != fresh[:-1]) | (~fresh[1:] & (rows[1:] != rows[:-1] + 1))
    bounds = np.append(np.flatnonzero(starts), len(rows)).tolist()
    delta = np.ascontiguousarray(carried.delta, np.float32).reshape(-1, row_bytes // 4)
    src = os.open(carried.source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        used = 0  # delta rows written so far
        for start, stop in zip(bounds[:-1], bounds[1:]):
            if fresh[start]:
                data, at = memoryview(delta[used:used + stop - start]).cast("B"), start * row_bytes
                used += stop - start
                while data:
                    done = os.pwrite(dst, data, at)
                    data, at = data[done:], at + done
            else:
                copy_range(src, dst, int(rows[start]) * row_bytes, start * row_bytes, (stop - start) * row_bytes)
    finally:
        os.close(src)


def write_vectors(file: Path, vectors, rows: int, dim: int) -> np.ndarray:
    """The base's vectors (an array, or CarriedVectors) written to `file`; returns them as an array
    (for carried rows, a mapping of `file`)."""
    with open(file, "wb") as f:  # not tofile(), whose OSError carries no errno
        if not isinstance(vectors, CarriedVectors):
            vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(rows, dim)
            f.write(vectors.data)
            return vectors
        if len(vectors.rows) != rows:
            raise ValueError(f"carried vectors: {len(vectors.rows)} rows for a base of {rows}")
        write_carried(f.fileno(), vectors, dim * 4)
    return np.memmap(file, dtype=np.float32, mode="r", shape=(rows, dim)) if rows else np.empty((0, dim), np.float32)


def settle(files: list[Path]) -> dict[str, tuple[int, int]]:
    """Each file's (size, CRC32C), once it is synced to disk."""
    out = {}
    for f in files:
        out[f.name] = _core.file_crc32c(str(f))
        fsync_path(f)
    return out


class Settling:
    """settle(files) in a thread of its own (a plain thread: a compaction may run while the interpreter
    exits, when executors take no more work), or at once where no thread can start."""

    def __init__(self, files: list[Path]):
        self.files, self.out, self.error = files, None, None
        self.thread = threading.Thread(target=self._run, name="memr1-settle")
        try:
            self.thread.start()
        except RuntimeError:  # the interpreter is shutting down
            self.thread = None
            self._run()

    def _run(self) -> None:
        try:
            self.out = settle(self.files)
        except BaseException as e:  # noqa: BLE001 - raised again by result()
            self.error = e

    def result(self) -> dict[str, tuple[int, int]]:
        if self.thread is not None:
            self.thread.join()
        if self.error is not None:
            raise self.error
        return self.out
