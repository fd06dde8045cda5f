"""A speaker's HNSW graph, built (or carried over from the generation before) so that no row is lost.

usearch's multi-threaded insertion sometimes leaves a node that no link leads to (a few per 20k rows
on 2 threads; none seen single-threaded), a cluster of identical vectors can cut other nodes off, and
on large graphs a greedy walk passes some reachable rows by (at 1e6 rows, ~2% of them for their own
vector). Such a memory is lost to the agent that stored it. So every graph is checked two ways:
- a native walk over its links of every level from the entry point (csrc/graph.cpp,
  Graph::unreachable; ~40 ms at 1e5 rows) finds the rows no search can reach, over every row;
- a search for each checked row's own vector (a screen at a small beam, the misses again at the full
  beam and a wider k) finds the rows a search passes by. A build screens every row; a fold (below)
  screens the rows it inserted, which is where its cost stays small.
A row counts as found when the search returns it, or returns k rows at least as close as an exact
duplicate would be (a tie: identical vectors that no graph can tell apart, whose texts come back).
A few lost rows (under REPAIR_FROM) become the graph's orphans at once: rows every search of that
speaker scores exactly besides the graph's candidates, which costs a search a few dot products. More
are removed and re-inserted; re-insertion rewires the neighbours of the rows it links, which can cut
off rows that were found before, so then the walk runs again and the screen again over what it
screened and the re-inserted rows, and the rows still lost become orphans. Nothing changes the graph
after the last check.

A compaction carries a graph over (`fold_graph`): the previous generation's saved graph with the rows
that died or changed removed, the surviving rows' keys renamed to their new base rows, and the new and
changed rows inserted; then the check. Its cost is in the changed rows, not the bank.
"""
import errno
import logging
import time
from typing import NamedTuple

import numpy as np
from usearch.index import Index

from memr1.memory_store import _core
from memr1.memory_store.errors import BankFormatError, BankIOError

log = logging.getLogger(__name__)

SCREEN_K = 10          # the screen: one search per row at this k and SCREEN_BEAM
SCREEN_BEAM = 16
CONFIRM_K = 100        # rows the screen missed, searched again at the index's own beam
TIE_DISTANCE = 1e-4    # cosine distance under which two vectors are the same to a quantised graph
REPAIR_FROM = 64       # fewer lost rows than this become orphans without a repair (and its second check)


class GraphCheck(NamedTuple):
    """What making one graph whole took: rows the first check missed, of those the rows re-insertion
    repaired, rows left as orphans (any row the last check missed); the rows inserted (all of them in a
    build, the new and changed ones in a fold) and the seconds inserting them, saving the graph (the
    native copy the walk reads) and checking it with its repairs (the cost the check adds)."""
    rows: int
    missed: int
    repaired: int
    orphans: int
    inserted: int
    insert_s: float
    save_s: float
    check_s: float


def new_index(config) -> Index:
    return Index(ndim=config.dim, metric="cos", dtype=config.hnsw_dtype, connectivity=config.hnsw_connectivity,
                 expansion_add=config.hnsw_expansion_add, expansion_search=config.hnsw_expansion_search)


class Built(NamedTuple):
    """A checked graph: the usearch index, the native graph searches use (graph.h), its orphans (sorted
    int64 keys the graph does not reach, scored exactly on every search) and what the check found."""
    index: Index
    graph: object
    orphans: np.ndarray
    check: GraphCheck


def native(index: Index, config, path=None):
    """The native graph of `index`: saved at `path` and memory-mapped from there (the file a segment
    keeps), or, with no path, a copy of its serialized bytes (a segment in memory)."""
    if path is None:
        return _core.Graph.load(index.save(), config.hnsw_expansion_search)
    try:
        index.save(str(path))
    except RuntimeError as e:  # usearch reports a failed write (a full disk) this way
        raise BankIOError(f"cannot write {path}: {e}", errno.EIO) from None
    return _core.Graph.view(str(path), config.hnsw_expansion_search)


def missed_by_search(index: Index, keys: np.ndarray, vectors: np.ndarray, beam: int = SCREEN_BEAM) -> np.ndarray:
    """The keys among `keys` (uint64; `vectors` their rows) that the search for their own vector does
    not return (nor k rows tied with it): screened at k=SCREEN_K and `beam`, confirmed at CONFIRM_K and
    the index's own beam."""
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


def lost_rows(index: Index, graph, keys: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Sorted uint64 keys that no search reaches (the walk over `graph`, the native copy of `index`,
    every row) or, among `keys` (with their `vectors`), that a search for their own vector misses."""
    walked = graph.unreachable() if len(index) else np.empty(0, np.uint64)
    return np.union1d(walked, missed_by_search(index, keys, vectors)).astype(np.uint64)


def reinsert(index: Index, lost: np.ndarray, vectors_of) -> None:
    """Remove the `lost` keys, then re-insert them (`vectors_of(keys)`: their rows) on one thread, one
    after another (each linked from the entry point like any new node). One add call for all of them:
    usearch grows its key table on every add call, which at 1e6 rows costs ~17 ms a call."""
    for key in lost.tolist():
        index.remove(key)
    index.add(lost, vectors_of(lost), threads=1)


def checked(index: Index, config, vectors_of, started: float, screen: tuple, path=None) -> Built:
    """`index` made whole (module doc), `screen` = (keys, their vectors: the rows inserted since
    `started`) searched for; saved at `path` if given (native). `vectors_of(keys)`: the rows of any
    keys, for a repair."""
    built = time.perf_counter()
    graph = native(index, config, path)
    save_s = time.perf_counter() - built
    missed = lost_rows(index, graph, *screen)
    lost, repaired = missed, 0
    if len(missed) >= REPAIR_FROM:
        graph = None  # its mapping of `path` goes before the file is written again
        reinsert(index, missed, vectors_of)
        at = time.perf_counter()
        graph = native(index, config, path)
        save_s += time.perf_counter() - at
        again = np.union1d(screen[0], missed).astype(np.uint64)  # the repair rewired neighbours
        lost = lost_rows(index, graph, again, vectors_of(again))
        repaired = len(np.setdiff1d(missed, lost))
    check = GraphCheck(len(index), len(missed), repaired, len(lost), len(screen[0]), built - started, save_s,
                       time.perf_counter() - built - save_s)
    if len(lost) > len(index) // 100:
        log.warning("HNSW graph of %d rows leaves %d rows to exact scans: its connectivity (%d) is too low "
                    "for this data", len(index), len(lost), config.hnsw_connectivity)
    elif len(missed):
        log.info("HNSW graph of %d rows: %s", len(index), check)
    return Built(index, graph, np.sort(lost.astype(np.int64)), check)


def build_graph(keys: np.ndarray, vectors: np.ndarray, config, threads: int = 0, path=None) -> Built:
    """A graph over `keys` (uint64 base rows) and their `vectors`, checked (and saved at `path`, if
    given); `threads`: 0 for all cores."""
    start = time.perf_counter()
    index = new_index(config)
    index.add(keys, vectors, threads=threads)
    order = np.argsort(keys)
    return checked(index, config, lambda some: vectors[order[np.searchsorted(keys, some, sorter=order)]], start,
                   (keys, vectors), path)


def fold_graph(before, removed: np.ndarray, renamed: tuple[np.ndarray, np.ndarray], added: np.ndarray, vectors,
               config, threads: int = 0, path=None) -> Built:
    """The graph saved at `before` (the generation before) with the `removed` keys taken out, the keys
    renamed[0] renamed to renamed[1] (each to a row no higher, in ascending order, so no key is renamed
    onto one still in use), and the `added` keys inserted; `vectors` (the new base's rows, indexed by
    key) gives their rows. Checked (and saved at `path`) as a build is. uint64 keys throughout."""
    index = Index.restore(str(before))  # a copy in memory: the saved file is never written
    if index is None or index.ndim != config.dim:
        raise BankFormatError(f"{before} is not a usearch index of dim {config.dim}")
    index.expansion_add, index.expansion_search = config.hnsw_expansion_add, config.hnsw_expansion_search
    if len(removed):
        index.remove(removed)
    if len(renamed[0]):
        index.rename(renamed[0], renamed[1])
    new = vectors[added.astype(np.int64)]
    start = time.perf_counter()  # the insertion: the part of a fold that grows with the rows it adds
    if len(added):
        index.add(added, new, threads=threads)
    return checked(index, config, lambda some: vectors[some.astype(np.int64)], start, (added, new), path)
