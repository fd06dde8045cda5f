"""The immutable base segment: vectors, records and, for large speakers, an HNSW index per speaker.

On disk a segment is a folder `base-<generation>/` written to a `.tmp` sibling and renamed, so a
crash never leaves half a segment under the final name. Vectors are memory-mapped; HNSW indexes are
opened as read-only usearch views (`view=True`), which the bank never writes to.
"""
import os
import shutil
from pathlib import Path

import msgspec
import numpy as np
from usearch.index import Index

from memr1.memory_store.records import BankConfig, Memory

_memories = msgspec.msgpack.Decoder(list[Memory])


class Segment:
    """Shared, read-only state of a base. `rows_by_speaker` lists base rows per speaker; speakers
    in `indexes` are searched by HNSW, the rest exactly."""

    def __init__(self, vectors: np.ndarray, memories: list[Memory], indexes: dict[str, Index]):
        self.vectors = vectors
        self.memories = memories
        self.indexes = indexes
        speakers = np.array([m.speaker for m in memories], dtype=object)
        self.rows_by_speaker = {s: np.flatnonzero(speakers == s).astype(np.int64) for s in set(speakers.tolist())}

    def __len__(self) -> int:
        return len(self.memories)

    def candidates(self, query: np.ndarray, count: int, speaker: str | None) -> np.ndarray | None:
        """Base rows worth scoring exactly, or None when the whole base is small enough to scan."""
        if not self.indexes:
            return None
        speakers = [speaker] if speaker is not None else list(self.rows_by_speaker)
        parts = []
        for s in speakers:
            index = self.indexes.get(s)
            if index is not None:
                parts.append(index.search(query, min(count, len(index))).keys.astype(np.int64))
            elif s in self.rows_by_speaker:
                parts.append(self.rows_by_speaker[s])
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def core_rows(self) -> list[tuple]:
        return [(m.id, m.text, m.speaker, m.timestamp, m.created, m.updated, m.previous_text) for m in self.memories]


def build_indexes(vectors: np.ndarray, memories: list[Memory], config: BankConfig) -> dict[str, Index]:
    by_speaker: dict[str, list[int]] = {}
    for row, m in enumerate(memories):
        by_speaker.setdefault(m.speaker, []).append(row)
    indexes = {}
    for speaker, rows in by_speaker.items():
        if len(rows) < config.hnsw_threshold:
            continue
        index = Index(ndim=config.dim, metric="cos", dtype=config.hnsw_dtype,
                      connectivity=config.hnsw_connectivity, expansion_add=config.hnsw_expansion_add,
                      expansion_search=config.hnsw_expansion_search)
        keys = np.asarray(rows, dtype=np.uint64)
        index.add(keys, vectors[keys.astype(np.int64)])
        indexes[speaker] = index
    return indexes


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_segment(folder: Path, vectors: np.ndarray, memories: list[Memory], config: BankConfig) -> list[str]:
    """Write a complete segment at `folder` atomically. Returns the speakers that got an HNSW index."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(memories), config.dim)
    vectors.tofile(tmp / "vectors.f32")
    (tmp / "records.msgpack").write_bytes(msgspec.msgpack.encode(memories))
    indexes = build_indexes(vectors, memories, config)
    speakers = sorted(indexes)
    for i, speaker in enumerate(speakers):
        indexes[speaker].save(str(tmp / f"hnsw-{i}.usearch"))
    for f in tmp.iterdir():
        _fsync_path(f)
    _fsync_path(tmp)
    os.replace(tmp, folder)
    _fsync_path(folder.parent)
    return speakers


def open_segment(folder: Path, config: BankConfig, speakers_indexed: list[str]) -> Segment:
    memories = _memories.decode((folder / "records.msgpack").read_bytes())
    if memories:
        vectors = np.memmap(folder / "vectors.f32", dtype=np.float32, mode="r", shape=(len(memories), config.dim))
    else:
        vectors = np.empty((0, config.dim), np.float32)
    indexes = {}
    for i, speaker in enumerate(speakers_indexed):
        index = Index.restore(str(folder / f"hnsw-{i}.usearch"), view=True)
        index.expansion_search = config.hnsw_expansion_search
        indexes[speaker] = index
    return Segment(vectors, memories, indexes)


def memory_segment(vectors: np.ndarray, memories: list[Memory], config: BankConfig) -> Segment:
    """A segment for a bank with no folder (in-memory banks and forks of them)."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(memories), config.dim)
    return Segment(vectors, memories, build_indexes(vectors, memories, config))
