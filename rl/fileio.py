"""Writing a file whole or not at all, never through a link, and reading one only when it is a regular
file. Output folders (a report's, a rollout's, the caches) may hold anything a user or another
process left there: a symlink where an output goes, a FIFO or a device where an input is read.

write_atomic  the bytes go to a new file created exclusively beside the target (O_CREAT | O_EXCL |
              O_NOFOLLOW, under a name nobody can have planted in advance), are fsynced, and the file
              is renamed over the target. A rename replaces a symlink itself, never what it points to,
              so nothing is written outside the folder; a reader sees the old file or the new one.
read_regular  the bytes of a regular file, at most `limit` of them: a FIFO would block forever and a
              device never ends, so neither is opened as data.
"""
from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import BinaryIO, Callable

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def write_atomic(path: str | Path, data: str | bytes | Callable[[BinaryIO], None], fsync: bool = True) -> None:
    """Replace `path` with `data` (text as UTF-8, bytes, or a function writing to a binary file).
    OSError (the folder is missing, not a folder, read-only, full) leaves `path` as it was."""
    path = Path(path)
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o666)
            break
        except FileExistsError:   # a name already taken (by chance or planted): draw another
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if fsync:
        fsync_dir(path.parent)


def fsync_dir(folder: str | Path) -> None:
    """Make the renames in `folder` survive a crash (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY | _CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def is_temporary(name: str) -> bool:
    """A leftover of write_atomic killed between create and rename."""
    return name.startswith(".") and name.endswith(".tmp")


class NotRegularFile(OSError):
    """The path is a FIFO, a device, a socket or a folder where a regular file was expected."""


def regular(path: str | Path) -> bool:
    """Whether `path` is a regular file (a symlink to one counts), without opening it."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def open_regular(path: str | Path) -> BinaryIO:
    """`path` opened for reading, once checked to be a regular file: stat first, so no FIFO or device
    is opened at all, then O_NONBLOCK and fstat, so a file swapped in between cannot block either."""
    path = Path(path)
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(f"{path} is not a regular file")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | _CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(f"{path} is not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | Path, limit: int = 64 << 20) -> bytes:
    """The bytes of the regular file `path`; NotRegularFile for anything else, ValueError past `limit`."""
    with open_regular(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} is over {limit} bytes")
    return data


# Bytes per element of each safetensors dtype; a dtype not here is checked for its offsets only.
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
MAX_HEADER = 100 << 20   # safetensors' own bound on the header


def safetensors_header(path: str | Path) -> dict:
    """The header of a safetensors file, checked against the file before anything trusts it: its length
    within the file, JSON of an object, each tensor's dtype, shape and byte range inside the data and of
    the size its shape needs. ValueError naming what is wrong (a tampered length would otherwise be a
    MemoryError or OverflowError, a missing member a KeyError)."""
    import json
    import math

    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{size} bytes: too short for a safetensors header")
        n = int.from_bytes(head, "little")
        if n > min(MAX_HEADER, size - 8):
            raise ValueError(f"header length {n} runs past the file ({size} bytes) or over {MAX_HEADER}")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"header is not JSON ({type(e).__name__})") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    data = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            if info is not None and not (isinstance(info, dict) and all(isinstance(v, str) for v in info.values())):
                raise ValueError("__metadata__ is not an object of strings")
            continue
        ok = isinstance(info, dict) and isinstance(info.get("dtype"), str)
        shape, offsets = (info.get("shape"), info.get("data_offsets")) if ok else (None, None)
        if not (ok and isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)
                and isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            raise ValueError(f"tensor {name[:100]!r}: no dtype, shape and data_offsets of their types")
        start, end = offsets
        if not 0 <= start <= end <= data:
            raise ValueError(f"tensor {name[:100]!r}: bytes {start}..{end} outside the {data} bytes of data")
        if info["dtype"] in DTYPE_BYTES and math.prod(shape) * DTYPE_BYTES[info["dtype"]] != end - start:
            raise ValueError(f"tensor {name[:100]!r}: shape {shape} of {info['dtype']} does not fill bytes "
                             f"{start}..{end}")
    return header
