"""The bank's folder on disk: config validation, generations, the manifest, the writer lock.

MANIFEST.json is the commit point: a generation (base-<gen>/ + log-<gen>.oplog) exists for readers only
once the manifest that names it has been renamed into place.
"""
import fcntl
import os
import shutil
from pathlib import Path

import msgspec
import numpy as np

from memr1.memory_store import _core
from memr1.memory_store.errors import BankError, BankFormatError, BankLocked, InvalidInput
from memr1.memory_store.records import FORMAT, VERSION, BankConfig, Manifest
from memr1.memory_store.segment import write_segment


def make_config(dim, config, overrides) -> BankConfig:
    if config is None:
        if dim is None:
            raise InvalidInput("give the vector dim (dim=...) or a BankConfig")
        config = BankConfig(dim=dim)
    elif dim is not None and dim != config.dim:
        raise InvalidInput(f"dim={dim} disagrees with config.dim={config.dim}")
    config = msgspec.structs.replace(config, **overrides) if overrides else config
    try:
        return msgspec.convert(msgspec.to_builtins(config), BankConfig)  # validates literals and types
    except msgspec.ValidationError as e:
        raise InvalidInput(f"bad bank config: {e}") from None


def validate_rows(config: BankConfig, vectors: np.ndarray, texts: list[str], speakers: list[str]) -> None:
    """The checks an Add makes, vectorised for bulk loads."""
    if vectors.dtype != np.float32 or vectors.ndim != 2 or vectors.shape[1] != config.dim:
        raise InvalidInput(f"vectors must be float32 of shape (n, {config.dim}), got {vectors.dtype} {vectors.shape}")
    bad = np.flatnonzero(~np.isfinite(vectors).all(axis=1) | ~(vectors != 0).any(axis=1))
    if len(bad):
        raise InvalidInput(f"vector of row {bad[0]} is non-finite or all zeros")
    for i, (t, s) in enumerate(zip(texts, speakers)):
        if not t or len(t.encode()) > config.max_text_bytes or not s:
            raise InvalidInput(f"row {i}: text must be 1..{config.max_text_bytes} bytes and speaker non-empty")


def write_generation(path: Path, manifest: Manifest, vectors, memories) -> Manifest:
    gen = manifest.generation
    speakers = write_segment(path / f"base-{gen}", vectors, memories, manifest.config)
    log = path / f"log-{gen}.oplog"
    log.unlink(missing_ok=True)  # a leftover of an interrupted compaction to this generation
    _core.OpLog.create(str(log), gen)
    manifest = msgspec.structs.replace(manifest, speakers_indexed=speakers)
    tmp = path / "MANIFEST.json.tmp"
    with open(tmp, "wb") as f:
        f.write(msgspec.json.encode(manifest))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / "MANIFEST.json")  # the commit point
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    return manifest


def read_manifest(path: Path) -> Manifest:
    if not path.exists():
        raise BankError(f"no bank at {path}: the path does not exist")
    file = path / "MANIFEST.json"
    if not file.is_file():
        raise BankFormatError(f"{path} is not a memr1 bank: it has no MANIFEST.json")
    try:
        raw = msgspec.json.decode(file.read_bytes())
    except msgspec.DecodeError as e:
        raise BankFormatError(f"{file} is not valid JSON: {e}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise BankFormatError(f"{path} is not a memr1 bank (format is {raw.get('format') if isinstance(raw, dict) else raw!r})")
    if raw.get("version") != VERSION:
        raise BankFormatError(f"{path} is a memr1 bank of version {raw.get('version')}; this code reads version {VERSION}")
    try:
        return msgspec.convert(raw, Manifest)
    except msgspec.ValidationError as e:
        raise BankFormatError(f"{file} is malformed: {e}") from None


def lock(path: Path) -> int:
    fd = os.open(path / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise BankLocked(f"bank {path} is already open for writing (by pid {holder}); "
                         f"open it with mode='r' to read alongside") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def remove_stale(path: Path, generation: int) -> None:
    """Drop files of other generations: leftovers of a compaction that crashed or just finished."""
    keep = {f"base-{generation}", f"log-{generation}.oplog", "MANIFEST.json", "LOCK"}
    for entry in path.iterdir():
        if entry.name in keep or not entry.name.startswith(("base-", "log-", "MANIFEST.json.")):
            continue
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
