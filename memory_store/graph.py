"""A speaker's HNSW graph, built so that every row is found by a search for its own vector.

usearch's multi-threaded insertion sometimes leaves a node that no search reaches (a few per 20k rows
on 2 threads; none seen single-threaded), and a cluster of identical vectors can cut other nodes off.
Such a memory is silently lost to the agent that stored it. So every build is checked: each row's
own vector is searched (a cheap screen at a small beam, then the rows it missed again at the full
beam and a wider k). A few missing rows (under REPAIR_FROM) become the graph's orphans at once: rows
every search of that speaker scores exactly besides the graph's candidates, which costs a search a
few dot products. More are removed and re-inserted; re-insertion rewires the neighbours of the rows
it links, which can cut off rows that were found before (at 1e6 rows, repairs of a few thousand rows
left ~1,800 others unreachable), so then every row is screened again and the rows still missing
become orphans. Nothing changes the graph after the last screen, so every row is found or an orphan.

A row counts as found when the search returns it, or returns k rows at least as close as an exact
duplicate would be (a tie: identical vectors that no graph can tell apart, whose texts come back).
"""
import logging
import time
from typing import NamedTuple

import numpy as np
from usearch.index import Index

log = logging.getLogger(__name__)

SCREEN_K = 10          # the first pass: one search per row at this k and SCREEN_BEAM
SCREEN_BEAM = 16
CONFIRM_K = 100        # rows the screen missed, searched again at the configured beam
TIE_DISTANCE = 1e-4    # cosine distance under which two vectors are the same to a quantised graph
REPAIR_FROM = 64       # fewer lost rows than this become orphans without a repair (and its second screen)


class GraphCheck(NamedTuple):
    """What making one graph whole took: rows the first check missed, of those the rows re-insertion
    repaired, rows left as orphans (any row the last check missed); seconds of the insertion and of the
    check with its repairs (the cost it adds)."""
    rows: int
    missed: int
    repaired: int
    orphans: int
    build_s: float
    check_s: float


def new_index(config) -> Index:
    return Index(ndim=config.dim, metric="cos", dtype=config.hnsw_dtype, connectivity=config.hnsw_connectivity,
                 expansion_add=config.hnsw_expansion_add, expansion_search=config.hnsw_expansion_search)


def unreachable(index: Index, keys: np.ndarray, vectors: np.ndarray, beam: int) -> np.ndarray:
    """The keys among `keys` (uint64; `vectors` their rows) that the search for their own vector does
    not return: screened at k=SCREEN_K and `beam`, confirmed at CONFIRM_K and the index's own beam."""
    if not len(keys):
        return keys
    configured = index.expansion_search
    index.expansion_search = beam
    try:
        found = index.search(vectors, SCREEN_K).keys
    finally:
        index.expansion_search = configured
    missed = np.flatnonzero(~(found.reshape(len(keys), -1) == keys[:, None]).any(1))
    if not len(missed):
        return keys[:0]
    k = min(CONFIRM_K, len(index))
    again = index.search(vectors[missed], k)
    ids, dist = again.keys.reshape(len(missed), -1), again.distances.reshape(len(missed), -1)
    lost = ~(ids == keys[missed][:, None]).any(1)
    tied = dist[:, -1] <= TIE_DISTANCE if k == CONFIRM_K else np.zeros_like(lost)
    return keys[missed[lost & ~tied]]


def reinsert(index: Index, keys: np.ndarray, vectors: np.ndarray, lost: np.ndarray) -> None:
    """Remove the `lost` keys, then re-insert them on one thread, one after another (each linked from
    the entry point like any new node). One add call for all of them: usearch grows its key table on
    every add call, which at 1e6 rows costs ~17 ms a call."""
    order = np.argsort(keys)
    rows = order[np.searchsorted(keys, lost, sorter=order)]
    for key in lost.tolist():
        index.remove(key)
    index.add(lost, vectors[rows], threads=1)


def build_graph(keys: np.ndarray, vectors: np.ndarray, config, threads: int = 0
                ) -> tuple[Index, np.ndarray, GraphCheck]:
    """A graph over `keys` (uint64 base rows) and their `vectors`, and its orphans (int64 keys the graph
    does not return, to be scored exactly on every search); `threads`: 0 for all cores."""
    start = time.perf_counter()
    index = new_index(config)
    index.add(keys, vectors, threads=threads)
    built = time.perf_counter()
    missed = unreachable(index, keys, vectors, SCREEN_BEAM)
    lost, repaired = missed, 0
    if len(missed) >= REPAIR_FROM:
        reinsert(index, keys, vectors, missed)
        lost = unreachable(index, keys, vectors, SCREEN_BEAM)  # every row: the repair rewired neighbours
        repaired = len(np.setdiff1d(missed, lost))
    check = GraphCheck(len(keys), len(missed), repaired, len(lost), built - start, time.perf_counter() - built)
    if len(lost) > len(keys) // 100:
        log.warning("HNSW graph of %d rows leaves %d rows to exact scans: its connectivity (%d) is too low "
                    "for this data", len(keys), len(lost), config.hnsw_connectivity)
    elif len(missed):
        log.info("HNSW graph of %d rows: %s", len(keys), check)
    return index, np.sort(lost.astype(np.int64)), check
