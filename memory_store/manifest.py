"""MANIFEST.json: encoded with a CRC32C of its own bytes, and read back only if they match.

The checksum is the last member, `"checksum":<crc>`, over the file's bytes with that member taken out,
so it checks exactly what was written. Manifests written before it existed have none and still open;
older code reading a new manifest ignores the member.
"""
import os
import re
from pathlib import Path

import msgspec

from memr1.memory_store import _core
from memr1.memory_store.errors import BankError, BankFormatError, BankIOError
from memr1.memory_store.records import FORMAT, READS_VERSIONS, Manifest
from memr1.memory_store.segment_io import read_regular

_CHECKSUM = re.compile(rb',"checksum":(\d{1,10})}$')


def encode_manifest(manifest: Manifest) -> bytes:
    body = msgspec.json.encode(manifest)
    return body[:-1] + b',"checksum":%d}' % _core.crc32c(body)


def read_manifest(path: Path) -> Manifest:
    file = path / "MANIFEST.json"
    try:
        if not path.exists():
            raise BankError(f"no bank at {path}: the path does not exist")
        if file.is_symlink():
            raise BankFormatError(f"{file} is a symlink; a bank's MANIFEST.json must be a regular file")
        if not file.is_file():
            raise BankFormatError(f"{path} is not a memr1 bank: it has no MANIFEST.json file")
        data = read_regular(file)
    except OSError as e:
        raise BankIOError(f"cannot read {file}: {e.strerror}", e.errno or 0) from None
    sealed = _CHECKSUM.search(data)
    if sealed:
        data = data[:sealed.start()] + b"}"
        if _core.crc32c(data) != int(sealed.group(1)):
            raise BankFormatError(f"{file} is damaged: its bytes do not match the checksum it carries")
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError as e:
        raise BankFormatError(f"{file} is not valid JSON: {e}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise BankFormatError(f"{path} is not a memr1 bank (format is {raw.get('format') if isinstance(raw, dict) else raw!r})")
    if raw.get("version") not in READS_VERSIONS:
        raise BankFormatError(f"{path} is a memr1 bank of version {raw.get('version')}; this code reads versions "
                              f"{' and '.join(map(str, READS_VERSIONS))}")
    try:
        manifest = msgspec.convert(raw, Manifest)
    except msgspec.ValidationError as e:
        raise BankFormatError(f"{file} is malformed: {e}") from None
    if manifest.version >= 2 and not manifest.files:
        raise BankFormatError(f"{file} is malformed: it records no checksums of its base segment")
    return manifest


def write_manifest(path: Path, manifest: Manifest) -> None:
    """Commit `manifest` as path/MANIFEST.json: a fresh temporary file (never one a symlink names), synced,
    renamed into place. OSError on failure."""
    tmp = path / "MANIFEST.json.tmp"
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(encode_manifest(manifest))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / "MANIFEST.json")  # the commit point
