"""One call for the searches of many forks of one bank: a rollout group's G forks, each with its own
few ops, each answering its own query (`search_forks`).

The forks share their base, so the base is scored for all queries together: an exact base by one
matrix product of the queries with its vectors (BLAS, one pass over the base instead of G), a graph
base by one walk per query in the native core with no Python in between; then, without the GIL, each
query skips its own fork's dead base rows and scans its own delta. The ids equal G calls of
`bank.search`; scores of exact bases may differ from them in the last bits (the product's sums run in
another order), which can swap two hits whose scores tie to within that.
"""
from typing import Sequence

import numpy as np

from memr1.memory_store import _core
from memr1.memory_store.bank import MemoryBank
from memr1.memory_store.errors import InvalidInput
from memr1.memory_store.inputs import check_search
from memr1.memory_store.segment import SearchResult


def search_forks(banks: Sequence[MemoryBank], queries: np.ndarray, k: int = 10, speaker: str | None = None,
                 exact: bool = False) -> list[SearchResult]:
    """`banks[i].search(queries[i], k, speaker, exact)` for every i, in one call. `queries`: float32 of
    shape (len(banks), dim). The banks must share a base: forks of one bank (or of its forks) since its
    last compaction."""
    k = check_search(k, speaker)
    views = [bank._view for bank in banks]  # one (state, segment) pair each, should a bank compact meanwhile
    if not views:
        return []
    segment = views[0][1]
    if any(s is not segment for _, s in views):
        raise InvalidInput("search_forks: the banks do not share a base (they must be forks of one bank since "
                           "its last compaction)")
    rows, graphs = (None, []) if exact else segment.plan(speaker)
    count = int(k * banks[0].config.hnsw_oversample)
    dots = None
    if rows is None and len(segment) and isinstance(queries, np.ndarray) and queries.dtype == np.float32 \
            and queries.shape == (len(banks), banks[0].config.dim):
        dots = queries @ segment.vectors.T  # one BLAS product for every query's scan of the base
    ids, scores, hits = _core.search_many([core for core, _ in views], queries, k, speaker, rows, graphs, count, dots)
    return [SearchResult(ids[i, :h], scores[i, :h]) for i, h in enumerate(hits.tolist())]
