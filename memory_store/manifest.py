"""MANIFEST.json: the bank's commit point, read back only if its checksum matches.

The file is a JSON object whose member `checksum` is the CRC32C of the canonical encoding of the other
members (msgspec's JSON with sorted keys): of what is decoded, not of the bytes as they lie, so the check
cannot be skipped by reformatting (whitespace, line endings, member order) and covers every value that
is trusted. A manifest without it, of another format or of any version but this code's is refused, and
so is one larger than any manifest the bank writes, before it is read.
"""
import os
from pathlib import Path

import msgspec

from memr1.memory_store import _core
from memr1.memory_store.errors import BankError, BankFormatError, BankIOError
from memr1.memory_store.schema import FORMAT, VERSION, Manifest
from memr1.memory_store.segment_io import read_regular

# Far above what a bank writes (its config, a few checksums, graph orphan rows), far below what would
# strain memory to read.
MAX_MANIFEST_BYTES = 1 << 26


def _canonical(members: dict) -> bytes:
    return msgspec.json.encode(members, order="sorted")


def seal(members: dict) -> bytes:
    """MANIFEST.json's bytes for `members` (a dict, none named checksum): them in their order, then
    their checksum."""
    return msgspec.json.encode(members)[:-1] + b',"checksum":%d}' % _core.crc32c(_canonical(members))


def encode_manifest(manifest: Manifest) -> bytes:
    data = seal(msgspec.to_builtins(manifest))  # format and version first, for a human reading it
    if len(data) > MAX_MANIFEST_BYTES:
        raise BankError(f"a manifest of {len(data)} bytes, over the limit of {MAX_MANIFEST_BYTES}")
    return data


def read_manifest(path: Path) -> Manifest:
    file = path / "MANIFEST.json"
    try:
        if not path.exists():
            raise BankError(f"no bank at {path}: the path does not exist")
        if file.is_symlink():
            raise BankFormatError(f"{file} is a symlink; a bank's MANIFEST.json must be a regular file")
        if not file.is_file():
            raise BankFormatError(f"{path} is not a memr1 bank: it has no MANIFEST.json file")
        data = read_regular(file, MAX_MANIFEST_BYTES)
    except OSError as e:
        raise BankIOError(f"cannot read {file}: {e.strerror}", e.errno or 0) from None
    try:
        raw = msgspec.json.decode(data)
        checksum = raw.pop("checksum", None) if isinstance(raw, dict) else None
        canonical = _canonical(raw) if isinstance(raw, dict) else b""
    except (msgspec.DecodeError, msgspec.EncodeError, RecursionError, OverflowError) as e:
        raise BankFormatError(f"{file} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise BankFormatError(f"{path} is not a memr1 bank: {file} holds a JSON {type(raw).__name__}, not an object")
    # format and version before the checksum, which older versions computed otherwise: either way such a
    # file is only refused, so nothing unchecked is trusted
    if raw.get("format") != FORMAT:
        raise BankFormatError(f"{path} is not a memr1 bank (format is {raw.get('format')!r})")
    if raw.get("version") != VERSION:
        raise BankFormatError(f"{path} is a memr1 bank of version {raw.get('version')}; this code reads version "
                              f"{VERSION} only (rebuild the bank)")
    if type(checksum) is not int:
        raise BankFormatError(f"{file} is damaged: it carries no checksum")
    if _core.crc32c(canonical) != checksum:
        raise BankFormatError(f"{file} is damaged: its contents do not match the checksum it carries")
    try:
        manifest = msgspec.convert(raw, Manifest)
    except msgspec.ValidationError as e:
        raise BankFormatError(f"{file} is malformed: {e}") from None
    if not manifest.files:
        raise BankFormatError(f"{file} is malformed: it records no checksums of its base segment")
    return manifest


def write_manifest(path: Path, manifest: Manifest) -> None:
    """Commit `manifest` as path/MANIFEST.json: a fresh temporary file (never one a symlink names), synced,
    renamed into place. OSError on failure."""
    data = encode_manifest(manifest)
    tmp = path / "MANIFEST.json.tmp"
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / "MANIFEST.json")  # the commit point
