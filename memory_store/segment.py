"""The immutable base segment: vectors, records and, for large speakers, an HNSW index per speaker.

On disk a segment is a folder `base-<generation>/` written to a `.tmp` sibling and renamed, so a
crash never leaves half a segment under the final name. Vectors are memory-mapped; HNSW indexes are
memory-mapped and searched by the native core (csrc/graph.h), which never writes to them. The manifest records
each file's size and CRC32C, checked at open: a flipped bit would otherwise be a wrong score, not an error.
Segment files are never modified or truncated once renamed into place, so a mapping of one is safe
for as long as it lives, even after the writer deletes the file.
"""
import ctypes
import functools
import os
import shutil
import stat
import weakref
from pathlib import Path
from typing import NamedTuple

import msgspec
import numpy as np

# The system libstdc++, loaded globally before usearch: usearch's wheel links its own copy statically,
# and when that copy is the first in the process, the C++ number formatting of libraries loaded later
# against the system one breaks (torch: each message cut at its first integer, torch.compile failing
# on slices; pytorch/pytorch#109923). Linux only; elsewhere a no-op.
try:
    ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
except OSError:
    pass
import usearch.index  # noqa: F401,E402 - usearch after the system libstdc++, above

from memr1.memory_store import _core
from memr1.memory_store.errors import BankFormatError, BankIOError
from memr1.memory_store.graph import build_graph, fold_graph
from memr1.memory_store.schema import BankConfig, Memory
from memr1.memory_store.segment_io import Settling, encode_memories, fsync_path, read_regular, settle, write_vectors

_memories = msgspec.msgpack.Decoder(list[Memory])


class SearchResult(NamedTuple):
    ids: np.ndarray     # int64, best first
    scores: np.ndarray  # float32 cosine similarity


class RowIndex(NamedTuple):
    """A base's rows grouped by speaker (`by_speaker`: ascending int64 rows) and versioned (`ids`,
    `updated`: int64 per row; a memory whose pair is unchanged has the same vector). Made once per
    segment: from the native columns when a compaction makes the rows (`of_columns`), so its thread
    holds the GIL for no per-row Python pass while other threads search; from the Memory objects when
    a base is read from disk (`of_memories`)."""
    by_speaker: dict[str, np.ndarray]
    ids: np.ndarray
    updated: np.ndarray

    @classmethod
    def of_memories(cls, memories: list[Memory]) -> "RowIndex":
        return cls(speaker_rows(memories), *versions(memories))

    @classmethod
    def of_columns(cls, ids: np.ndarray, updated: np.ndarray, speakers: np.ndarray) -> "RowIndex":
        """From LiveRows.columns(): speaker codes, named by _core.speaker_name."""
        order = np.argsort(speakers, kind="stable")   # rows ascending within each speaker
        codes, starts = np.unique(speakers[order], return_index=True)
        groups = np.split(order.astype(np.int64), starts[1:])
        return cls({_core.speaker_name(int(c)): g for c, g in zip(codes.tolist(), groups)}, ids, updated)


def speaker_rows(memories: list[Memory]) -> dict[str, np.ndarray]:
    by_speaker: dict[str, list[int]] = {}
    for row, m in enumerate(memories):
        by_speaker.setdefault(m.speaker, []).append(row)
    return {s: np.asarray(rows, np.int64) for s, rows in by_speaker.items()}


def versions(memories: list[Memory]) -> tuple[np.ndarray, np.ndarray]:
    n = len(memories)
    return (np.fromiter((m.id for m in memories), np.int64, n), np.fromiter((m.updated for m in memories), np.int64, n))


def _check_size(file, size: int, need: int) -> None:
    if size < need:
        raise BankFormatError(f"{file} shrank to {max(size, 0)} bytes under this open bank, which maps {need}: "
                              f"the bank was overwritten while open; reopen it")


class Segment:
    """Shared, read-only state of a base. `rows_by_speaker` lists base rows per speaker; speakers
    in `graphs` (native views of their saved HNSW indexes) are searched through the graph plus the
    graph's `orphans` (rows it does not return, scored exactly); the rest exactly. `checks`: what
    building its graphs took (graph.GraphCheck each; none for a segment read from disk)."""

    def __init__(self, vectors: np.ndarray, memories: list[Memory], graphs: dict[str, "_core.Graph"],
                 orphans: dict[str, list[int]] | None = None, checks: tuple = (), index: RowIndex | None = None):
        self.vectors = vectors
        self.memories = memories
        # The file a base read from disk maps its vectors from, and the bytes the mapping covers (see
        # check_mapped); None for vectors in memory.
        mapped = getattr(vectors, "_mmap", None)   # np.memmap's mmap.mmap, whose size() is its file's
        self._mapped = (mapped, vectors.nbytes, vectors.filename) if mapped is not None else None
        self._graph_files = []   # (fd, size, path) of the graph files the native views map (watch_graphs)
        self.graphs = graphs
        self.checks = checks
        self.orphans = {s: np.asarray(rows, np.int64) for s, rows in (orphans or {}).items() if rows}
        # A compaction hands its RowIndex on; a base read from disk groups its rows here and versions
        # them only when a compaction first asks (readers never do).
        self._index = index
        self.rows_by_speaker = index.by_speaker if index is not None else speaker_rows(memories)
        none = np.empty(0, np.int64)
        # What a search scores besides the graphs' candidates: per speaker, and for all speakers (None).
        # A base with no graph is scanned whole instead (plan), so it needs none.
        self.plans = {}
        if graphs:
            self.plans = {s: (self.orphans.get(s, none) if s in graphs else rows, [graphs[s]] if s in graphs else [])
                          for s, rows in self.rows_by_speaker.items()}
            rest = [self.plans[s][0] for s in sorted(self.plans)]
            self.plans[None] = (np.concatenate(rest) if rest else none, [graphs[s] for s in sorted(graphs)])

    def __len__(self) -> int:
        return len(self.memories)

    def check_mapped(self) -> None:
        """BankFormatError when the vectors file this base maps has shrunk (a copy over a live bank
        truncates it in place): reading a mapped page past the file's end kills the process (SIGBUS).
        One fstat, before each search reads the mapping."""
        if self._mapped is not None:
            mapped, need, file = self._mapped
            try:
                size = mapped.size()
            except (OSError, ValueError):   # ValueError: the mapping was closed
                size = -1
            _check_size(file, size, need)
        for fd, need, file in self._graph_files:
            try:
                size = os.fstat(fd).st_size
            except OSError:
                size = -1
            _check_size(file, size, need)

    def watch_graphs(self, files: list[Path]) -> None:
        """Have check_mapped check these files too: the graphs' native views map them. A descriptor of
        each is kept for that (the views keep none), closed with this segment."""
        for file in files:
            fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            weakref.finalize(self, os.close, fd)
            self._graph_files.append((fd, os.fstat(fd).st_size, file))

    @functools.cached_property
    def versions(self) -> tuple[np.ndarray, np.ndarray]:
        """(id, updated) of each row, int64: a memory whose pair is unchanged has the same vector."""
        return (self._index.ids, self._index.updated) if self._index is not None else versions(self.memories)

    def plan(self, speaker: str | None) -> tuple[np.ndarray | None, list]:
        """(base rows scored exactly, graphs whose candidates are scored too) for a search of `speaker`;
        (None, []) when the base has no graph: then every base row is scanned."""
        if not self.graphs:
            return None, []
        return self.plans.get(speaker, (np.empty(0, np.int64), []))

    def core_rows(self) -> list[tuple]:
        return [(m.id, m.text, m.speaker, m.timestamp, m.created, m.updated, m.previous_text, m.sources)
                for m in self.memories]


class Previous(NamedTuple):
    """The generation a compaction folds into the next one: its folder, the speakers its graphs are
    for (hnsw-<i>.usearch: the i-th) and its segment."""
    folder: Path
    speakers_indexed: list[str]
    segment: "Segment"


def fold_plan(previous: Previous, speaker: str, keys: np.ndarray, new: tuple[np.ndarray, np.ndarray],
              config: BankConfig) -> tuple | None:
    """(path, removed, renamed, added) to carry `speaker`'s graph over from `previous` to the base whose
    row r holds new[0][r] (ids) at new[1][r] (their `updated`), `keys` the speaker's rows; or None to
    build it anew: no graph before, or more changed rows than config.hnsw_rebuild_at of them. A row
    carries over when the same memory, not updated since, is in both bases (ids only grow, so it moves
    to a row no higher; `renamed` lists those that move); the rest of the old rows are removed and the
    rest of the new ones added."""
    if speaker not in previous.speakers_indexed or config.hnsw_rebuild_at <= 0:
        return None
    ids, updated = new
    old_rows = previous.segment.rows_by_speaker.get(speaker, np.empty(0, np.int64))
    old_ids, old_updated = (a[old_rows] for a in previous.segment.versions)
    at = np.minimum(np.searchsorted(ids, old_ids), len(ids) - 1)
    mine = np.zeros(len(ids), bool)
    mine[keys.astype(np.int64)] = True   # an update keeps the speaker; checked, not assumed
    same = (ids[at] == old_ids) & (updated[at] == old_updated) & mine[at]
    removed, kept_from, kept_to = old_rows[~same], old_rows[same], at[same]
    added = np.setdiff1d(keys.astype(np.int64), kept_to)
    if len(removed) + len(added) > config.hnsw_rebuild_at * len(keys):
        return None
    path = previous.folder / f"hnsw-{previous.speakers_indexed.index(speaker)}.usearch"
    u64 = lambda a: a.astype(np.uint64)  # noqa: E731
    moved = kept_from != kept_to  # rows stay put up to the first dead one (updates and adds move none)
    return path, u64(removed), (u64(kept_from[moved]), u64(kept_to[moved])), u64(added)


def build_indexes(vectors: np.ndarray, index: RowIndex, config: BankConfig, previous: Previous | None = None,
                  folder: Path | None = None) -> tuple[dict[str, "_core.Graph"], dict[str, list[int]], tuple]:
    """A graph per speaker with at least `hnsw_threshold` rows, checked so that no row is lost
    (graph.py), carried over from `previous` where it can be (fold_plan), saved in `folder` (the i-th
    speaker in order as hnsw-<i>.usearch) or kept in memory; the native graphs, the rows each leaves
    to exact scans (speakers with none are left out) and what each build took (GraphCheck)."""
    indexed = sorted(s for s, rows in index.by_speaker.items() if len(rows) >= config.hnsw_threshold)
    new = (index.ids, index.updated) if previous else None
    graphs, orphans, checks = {}, {}, []
    for i, speaker in enumerate(indexed):
        keys = index.by_speaker[speaker].astype(np.uint64)
        path = folder / f"hnsw-{i}.usearch" if folder is not None else None
        plan = fold_plan(previous, speaker, keys, new, config) if previous else None
        if plan is not None:
            built = fold_graph(*plan, vectors, config, path=path)
        else:
            built = build_graph(keys, vectors[keys.astype(np.int64)], config, path=path)
        graphs[speaker] = built.graph
        checks.append(built.check)
        if len(built.orphans):
            orphans[speaker] = built.orphans.tolist()
    return graphs, orphans, tuple(checks)


def write_segment(folder: Path, vectors, memories: list[Memory], config: BankConfig, previous: Previous | None = None,
                  index: RowIndex | None = None) -> tuple[list[str], dict[str, tuple[int, int]], dict[str, list[int]],
                                                          dict, tuple]:
    """Write a complete segment at `folder` atomically (`vectors`: an array, or CarriedVectors), its
    graphs carried over from `previous` where they can be (`index`: the rows', if the caller has it).
    Returns the speakers that got an HNSW
    index, each file's (size, CRC32C) and each graph's orphan rows (for the manifest), the native
    graphs (views of the files written, for open_segment) and what building them took."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    vectors = write_vectors(tmp / "vectors.f32", vectors, len(memories), config.dim)
    (tmp / "records.msgpack").write_bytes(encode_memories(memories))
    # The rows' files are checksummed and synced in a thread while the graphs are built (both mostly
    # without the GIL: disk writes, CRC32C and usearch's insertion).
    rows_settled = Settling([tmp / "vectors.f32", tmp / "records.msgpack"])
    try:
        graphs, orphans, checks = build_indexes(vectors, index or RowIndex.of_memories(memories), config, previous, tmp)
    finally:
        files = rows_settled.result()
    speakers = sorted(graphs)
    files |= settle([f for f in sorted(tmp.iterdir()) if f.name.startswith("hnsw-")])
    fsync_path(tmp)
    os.replace(tmp, folder)  # the graphs' mappings stay valid: a rename keeps the files
    fsync_path(folder.parent)
    return speakers, files, orphans, graphs, checks


def segment_files(speakers_indexed: list[str]) -> list[str]:
    return ["records.msgpack", "vectors.f32", *(f"hnsw-{i}.usearch" for i in range(len(speakers_indexed)))]


def verify_segment(folder: Path, files: dict[str, tuple[int, int]], speakers_indexed: list[str]) -> None:
    """Every file of the segment is there with the size and CRC32C its manifest recorded: every size
    first, so no file is read further than its manifest says it reaches."""
    names = segment_files(speakers_indexed)
    for name in names:
        if name not in files:
            raise BankFormatError(f"the manifest of {folder.parent} records no checksum for {folder / name}")
        size = os.lstat(folder / name).st_size
        if size != files[name][0]:
            raise BankFormatError(f"{folder / name} is damaged: {size} bytes, the manifest recorded {files[name][0]}")
    for name in names:
        want_size, want_crc = files[name]
        size, crc = _core.file_crc32c(str(folder / name))  # BankFormatError when missing
        if (size, crc) != (want_size, want_crc):
            raise BankFormatError(f"{folder / name} is damaged: {size} bytes with CRC32C {crc:#010x}, "
                                  f"the manifest recorded {want_size} bytes with {want_crc:#010x}")


def open_segment(folder: Path, config: BankConfig, speakers_indexed: list[str], base_rows: int,
                 files: dict[str, tuple[int, int]], memories: list[Memory] | None = None,
                 orphans: dict[str, list[int]] | None = None, graphs: dict | None = None, checks: tuple = (),
                 index: RowIndex | None = None) -> Segment:
    """Open a segment. `files`: the manifest's (size, CRC32C) of each file. `orphans`:
    the manifest's rows each graph leaves to exact scans. `memories` and `graphs`:
    its rows and native graphs as the caller just wrote them (compaction, whose write_segment computed
    the checksums from the same bytes), which are then neither checksummed nor read again; `checks`
    what building those graphs took; `index`, the rows' RowIndex, if the caller has it."""
    path = folder / "records.msgpack"
    try:
        for name in segment_files(speakers_indexed):  # a FIFO would hang the reads below
            path = folder / name
            if not stat.S_ISREG(os.lstat(path).st_mode):
                raise BankFormatError(f"{path} is not a regular file: the bank is damaged")
        if memories is None:
            verify_segment(folder, files, speakers_indexed)
        path = folder / "records.msgpack"
        if memories is None:
            memories = _memories.decode(read_regular(path, files["records.msgpack"][0]))
        path = folder / "vectors.f32"
        if len(memories) != base_rows:
            raise BankFormatError(f"{folder}/records.msgpack holds {len(memories)} rows, the manifest says {base_rows}")
        size = path.stat().st_size
        if size != len(memories) * config.dim * 4:
            raise BankFormatError(f"{path} is {size} bytes; {len(memories)} rows of dim {config.dim} need "
                                  f"{len(memories) * config.dim * 4}")
        if memories:
            vectors = np.memmap(path, dtype=np.float32, mode="r", shape=(len(memories), config.dim))
        else:
            vectors = np.empty((0, config.dim), np.float32)
        if graphs is None:  # else the caller's views of the files it just wrote
            graphs = {}
            for i, speaker in enumerate(speakers_indexed):
                path = folder / f"hnsw-{i}.usearch"
                graph = _core.Graph.view(str(path), config.hnsw_expansion_search)  # BankFormatError if not one
                if graph.dim != config.dim:
                    raise BankFormatError(f"{path} is not a usearch index of dim {config.dim}")
                graphs[speaker] = graph
    except FileNotFoundError:
        raise BankFormatError(f"{path} is missing: the bank is damaged") from None
    except (msgspec.DecodeError, ValueError, RuntimeError) as e:  # msgspec, numpy and usearch on bad bytes
        raise BankFormatError(f"{path} is damaged: {e}") from None
    except OSError as e:
        raise BankIOError(f"cannot read {path}: {e.strerror or e}", e.errno or 0) from None
    for speaker, rows in (orphans or {}).items():
        if speaker not in graphs or any(not 0 <= r < base_rows for r in rows):
            raise BankFormatError(f"{folder.parent}/MANIFEST.json: graph_orphans of {speaker!r} name no graph's "
                                  f"rows: the bank is damaged")
    segment = Segment(vectors, memories, graphs, orphans, checks, index)
    try:
        segment.watch_graphs([folder / f"hnsw-{i}.usearch" for i in range(len(speakers_indexed))])
    except OSError as e:
        raise BankIOError(f"cannot open the graphs of {folder}: {e.strerror or e}", e.errno or 0) from None
    return segment


def memory_segment(vectors: np.ndarray, memories: list[Memory], config: BankConfig,
                   index: RowIndex | None = None) -> Segment:
    """A segment for a bank with no folder (in-memory banks and forks of them)."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(memories), config.dim)
    index = index or RowIndex.of_memories(memories)
    graphs, orphans, checks = build_indexes(vectors, index, config)
    return Segment(vectors, memories, graphs, orphans, checks, index)


def state_over(config: BankConfig, segment: Segment, manifest):
    """A native state whose base is `segment`, at the manifest's next id and op count, with no delta."""
    core = _core.State(config.dim, config.max_text_bytes)
    core.set_base(segment.vectors, segment.core_rows(), manifest.next_id, manifest.lsn)
    return core
