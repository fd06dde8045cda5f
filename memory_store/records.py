"""msgspec types of the bank: what callers pass and get back, the op-log records, the config."""
from typing import Any, Literal

import msgspec


class Memory(msgspec.Struct, frozen=True):
    """One live memory. `created`/`updated` are op sequence numbers (the bank's logical clock);
    `timestamp` is the session time the caller gave, not the wall clock."""
    id: int
    text: str
    speaker: str
    timestamp: str
    created: int
    updated: int
    previous_text: str | None = None


# ---- operations (vectors are float32 numpy arrays of the bank's dim) ----
class Add(msgspec.Struct):
    text: str
    vector: Any
    speaker: str
    timestamp: str = ""


class Update(msgspec.Struct):
    id: int
    text: str
    vector: Any
    timestamp: str | None = None  # None keeps the memory's timestamp


class Delete(msgspec.Struct):
    id: int


class Noop(msgspec.Struct):
    pass


Op = Add | Update | Delete | Noop


# ---- op-log records: the native core writes exactly these encodings (tagged msgpack arrays) ----
class AddRecord(msgspec.Struct, array_like=True, tag="add"):
    id: int
    text: str
    speaker: str
    timestamp: str
    vector: bytes


class UpdateRecord(msgspec.Struct, array_like=True, tag="update"):
    id: int
    text: str
    timestamp: str | None
    vector: bytes


class DeleteRecord(msgspec.Struct, array_like=True, tag="delete"):
    id: int


class NoopRecord(msgspec.Struct, array_like=True, tag="noop"):
    pass


LogRecord = AddRecord | UpdateRecord | DeleteRecord | NoopRecord


class BankConfig(msgspec.Struct, frozen=True):
    """How a bank stores and searches. Saved in its manifest; `open` may override the fsync policy."""
    dim: int
    max_text_bytes: int = 4096
    # "never": page cache only (survives a killed process, not a power loss); "op": fsync every op;
    # "every_n": every `fsync_every` ops; "close": on close and compaction.
    fsync: Literal["never", "op", "every_n", "close"] = "close"
    fsync_every: int = 64
    # Base segments with at least this many rows per speaker get an HNSW index; smaller ones are
    # searched exactly. bench.memory_ops measures where exact search stops being cheaper.
    hnsw_threshold: int = 4_096  # bench.memory_ops' sweep: HNSW wins from ~4k rows
    hnsw_connectivity: int = 16
    hnsw_expansion_add: int = 64
    hnsw_expansion_search: int = 64
    # The graph is quantised (i8 builds ~3x faster than f32); its candidates are then re-scored
    # exactly in f32 from the memory-mapped vectors, `hnsw_oversample` x k of them, which restores recall.
    hnsw_dtype: Literal["f32", "f16", "i8"] = "i8"
    hnsw_oversample: float = 2.0


class Manifest(msgspec.Struct):
    format: str
    version: int
    config: BankConfig
    generation: int
    next_id: int
    lsn: int
    base_rows: int
    speakers_indexed: list[str] = []


FORMAT = "memr1-bank"
VERSION = 1
