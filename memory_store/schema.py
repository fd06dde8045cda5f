"""msgspec types of the bank: what callers pass and get back, the op-log records, the config."""
import os
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
from msgspec import Meta

from memr1.memory_store.errors import BankError, CorruptLog, InvalidInput


class Memory(msgspec.Struct, frozen=True):
    """One live memory. `created`/`updated` are op sequence numbers (the bank's logical clock);
    `timestamp` is the session time the caller gave, not the wall clock. `sources`: the dialogue turn
    ids it came from (Memory-R2's evidence recall), its ADD's, then each UPDATE's new ones, in order and
    without duplicates. Segments written before sources existed read back with ()."""
    id: int
    text: str
    speaker: str
    timestamp: str
    created: int
    updated: int
    previous_text: str | None = None
    sources: tuple[str, ...] = ()


# Bounds on sources (the native core checks them; a violation is InvalidInput and changes nothing):
MAX_OP_SOURCES = 64       # turn ids one Add or Update may carry
MAX_SOURCE_BYTES = 64     # UTF-8 bytes of one turn id (at least 1)
MAX_MEMORY_SOURCES = 1024 # distinct turn ids one memory may collect over its ADD and UPDATEs
# Bounds on every op (the native core checks them; logs written before them replay unchecked):
MAX_SPEAKER_BYTES = 1024  # UTF-8 bytes of a speaker
MAX_TIMESTAMP_BYTES = 256 # UTF-8 bytes of a timestamp
# A vector's L2 norm lies in [MIN_NORM, MAX_NORM]: float32 dot products of such vectors neither overflow
# (components near 3e38) nor underflow to a wrong score (all-denormal vectors). Queries too.
MIN_NORM, MAX_NORM = 2.0**-32, 2.0**32


# ---- operations (vectors are float32 numpy arrays of the bank's dim) ----
# `sources`: a tuple (or list) of the dialogue turn ids ("D3:7") the op came from; see Memory.sources.
class Add(msgspec.Struct):
    text: str
    vector: Any
    speaker: str
    timestamp: str = ""
    sources: tuple[str, ...] = ()


class Update(msgspec.Struct):
    id: int
    text: str
    vector: Any
    timestamp: str | None = None  # None keeps the memory's timestamp
    sources: tuple[str, ...] = ()  # appended to the memory's, those it already holds dropped


class Delete(msgspec.Struct):
    id: int


class Noop(msgspec.Struct):
    pass


Op = Add | Update | Delete | Noop


# ---- op-log records: the native core writes exactly these encodings (tagged msgpack arrays) ----
# `sources` trails with a default: the core writes it only when non-empty, so logs from before it
# existed (and ops without sources) are shorter arrays that decode to ().
class AddRecord(msgspec.Struct, array_like=True, tag="add"):
    id: int
    text: str
    speaker: str
    timestamp: str
    vector: bytes
    sources: tuple[str, ...] = ()


class UpdateRecord(msgspec.Struct, array_like=True, tag="update"):
    id: int
    text: str
    timestamp: str | None
    vector: bytes
    sources: tuple[str, ...] = ()  # the op's own; replay appends them as the op did


class DeleteRecord(msgspec.Struct, array_like=True, tag="delete"):
    id: int


class NoopRecord(msgspec.Struct, array_like=True, tag="noop"):
    pass


LogRecord = AddRecord | UpdateRecord | DeleteRecord | NoopRecord
_records = msgspec.msgpack.Decoder(LogRecord)


def apply_op(core, sink, op: Op) -> int | None:
    """Apply one caller's op to a native state, its record to `sink` (an op log, or None). Returns the
    memory id (None for Noop)."""
    t = type(op)
    if t is Add:
        return core.add(sink, op.text, op.speaker, op.timestamp, op.vector, op.sources)
    if t is Update:
        core.update(sink, op.id, op.text, op.timestamp, op.vector, op.sources)
        return op.id
    if t is Delete:
        core.delete(sink, op.id)
        return op.id
    if t is Noop:
        core.noop(sink)
        return None
    raise InvalidInput(f"not a bank operation: {t.__name__} (expected Add, Update, Delete or Noop)")


def replay(core, payloads, where, sink=None) -> None:
    """Apply a log's records to a native state (core); `sink` (a new generation's op log) logs them again."""
    for i, payload in enumerate(payloads):
        try:
            rec = _records.decode(payload)
            if type(rec) is AddRecord:
                got = core.add(sink, rec.text, rec.speaker, rec.timestamp, np.frombuffer(rec.vector, np.float32),
                               rec.sources, replay=True)
                if got != rec.id:
                    raise BankError(f"add record carries id {rec.id} but replay assigned {got}")
            elif type(rec) is UpdateRecord:
                core.update(sink, rec.id, rec.text, rec.timestamp, np.frombuffer(rec.vector, np.float32), rec.sources,
                            replay=True)
            elif type(rec) is DeleteRecord:
                core.delete(sink, rec.id)
            else:
                core.noop(sink)
        except (msgspec.DecodeError, BankError) as e:
            raise CorruptLog(f"op log record {i} of {where} cannot be replayed: {e}", -1) from e


# Upper bounds of the config's counts: far past any use, and low enough that a bank written with them
# opens again (a count of ops or rows fits the native core's int64; a larger HNSW beam fails to allocate).
MAX_COUNT = 1 << 30
MAX_EXPANSION = 1 << 16


class BankConfig(msgspec.Struct, frozen=True):
    """How a bank stores and searches. Saved in its manifest; `open` may override the fsync policy.
    The ranges are checked when a bank is created or opened (inputs.make_config, storage.read_manifest)."""
    dim: Annotated[int, Meta(ge=1, le=65_536)]
    max_text_bytes: Annotated[int, Meta(ge=1, le=1 << 24)] = 4096
    # "never": page cache only (survives a killed process, not a power loss); "op": fsync every op;
    # "every_n": every `fsync_every` ops; "close": on close and compaction.
    fsync: Literal["never", "op", "every_n", "close"] = "close"
    fsync_every: Annotated[int, Meta(ge=1, le=MAX_COUNT)] = 64
    # Base segments with at least this many rows per speaker get an HNSW index; smaller ones are
    # searched exactly. bench.memory_ops measures where exact search stops being cheaper.
    hnsw_threshold: Annotated[int, Meta(ge=0, le=MAX_COUNT)] = 4_096  # bench.memory_ops' sweep: HNSW wins from ~4k rows
    hnsw_connectivity: Annotated[int, Meta(ge=2, le=1024)] = 16  # usearch refuses 1
    hnsw_expansion_add: Annotated[int, Meta(ge=1, le=MAX_EXPANSION)] = 64
    hnsw_expansion_search: Annotated[int, Meta(ge=1, le=MAX_EXPANSION)] = 64
    # The graph is quantised (i8 builds ~3x faster than f32); its candidates are then re-scored
    # exactly in f32 from the memory-mapped vectors, `hnsw_oversample` x k of them, which restores recall.
    hnsw_dtype: Literal["f32", "f16", "i8"] = "i8"
    hnsw_oversample: Annotated[float, Meta(ge=1.0, le=1000.0)] = 2.0
    # A compaction of a bank on disk carries each speaker's graph over from the generation before
    # (its dead and changed rows removed, the new and changed ones inserted: work in the changed rows,
    # not the bank) unless the changed rows exceed this share of the speaker's rows; then, and for
    # banks in memory, it builds the graph anew. 0: always anew.
    hnsw_rebuild_at: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.25
    # Automatic compaction (bank.py) of writable banks; forks and readers never compact on their own.
    # After an op, a bank compacts once its delta rows exceed max(auto_compact_min_rows,
    # auto_compact_ratio x base rows), or its dead base rows (deleted or superseded) exceed
    # max(auto_compact_min_rows, auto_compact_dead_ratio x base rows); ratio 0 turns it off. Search
    # pays ~1 exact row scan per delta row, about as much as a 1e5 HNSW search per 2,000 rows at dim
    # 384, so the floor holds search near 2x there; the ratio bounds the amortised cost at larger sizes
    # (a compaction rewrites the base once per ratio x base changed rows). A dead row costs a search
    # only a skipped candidate: a graph walks plainly, with a small margin, while at most 1/8 of its
    # base is dead (csrc/graph.cpp), hence the dead ratio's default. bench.memory_ops measures both:
    # search_vs_dirty rows, and ops that compact (phase_ops, op rows).
    auto_compact_ratio: Annotated[float, Meta(ge=0.0, le=100.0)] = 0.02
    auto_compact_dead_ratio: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.125
    auto_compact_min_rows: Annotated[int, Meta(ge=1, le=MAX_COUNT)] = 2_048
    # True: the op that crosses the threshold starts the compaction in a background thread and returns;
    # ops and searches use the old generation until the new one is committed (compaction.py).
    # False: that op compacts before it returns (seconds at 1e5 rows).
    auto_compact_background: bool = True
    # Back-pressure: while a background compaction runs, an op waits for it to commit once the rows or
    # ops it must still catch up on (the delta's rows, the ops made since its snapshot) exceed
    # max(auto_compact_max_delta, 2 x the delta threshold above). Without it a burst outruns the
    # builds: each replays the ops made during it into a larger delta, and nothing bounds the delta or
    # close(). An op waits at most auto_compact_wait_s in all, then raises BankBusy unapplied (0: never
    # waits, refuses at once).
    auto_compact_max_delta: Annotated[int, Meta(ge=1, le=MAX_COUNT)] = 32_768
    auto_compact_wait_s: Annotated[float, Meta(ge=0.0, le=3600.0)] = 60.0

    def auto_compact_thresholds(self, base_rows: int) -> tuple[int, int] | None:
        """(delta rows, dead base rows) past either of which a writable bank over `base_rows` compacts
        itself; None: never."""
        if self.auto_compact_ratio <= 0:
            return None
        return (max(self.auto_compact_min_rows, int(self.auto_compact_ratio * base_rows)),
                max(self.auto_compact_min_rows, int(self.auto_compact_dead_ratio * base_rows)))

    def auto_compact_limit(self, delta_threshold: int) -> int:
        """The rows or ops a background compaction may have left to catch up on before ops wait for it
        (delta_threshold: the first of auto_compact_thresholds). Twice the threshold at least, so that
        the op crossing the threshold never waits for the compaction it starts."""
        return max(self.auto_compact_max_delta, 2 * delta_threshold)


class Manifest(msgspec.Struct):
    format: str
    version: int
    config: BankConfig
    generation: Annotated[int, Meta(ge=0)]
    next_id: Annotated[int, Meta(ge=0)]
    lsn: Annotated[int, Meta(ge=0)]
    base_rows: Annotated[int, Meta(ge=0)]
    # The bank's identity, random at create (and save): each of its op logs carries it in its header, so
    # a log moved in from another bank is refused. Compactions keep it.
    bank_id: Annotated[int, Meta(ge=1, le=2**63 - 1)]
    speakers_indexed: list[str] = []
    # base-<generation>/ file name -> [size, CRC32C], checked at open (sizes first)
    files: dict[str, tuple[Annotated[int, Meta(ge=0)], Annotated[int, Meta(ge=0)]]] = {}
    # speaker -> base rows its HNSW graph does not return, scored exactly on every search (graph.py)
    graph_orphans: dict[str, list[Annotated[int, Meta(ge=0)]]] = {}


def new_bank_id() -> int:
    return int.from_bytes(os.urandom(8), "little") >> 1 or 1  # 63 bits: msgspec bounds are int64


FORMAT = "memr1-bank"
# 3: op logs name their bank, the manifest's checksum is mandatory. Only this version is read: older banks
# (whose logs could belong to another bank) are rebuilt by their callers, not opened.
VERSION = 3
