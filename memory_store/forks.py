"""One call for the searches of many forks of one bank: a rollout group's G forks, each with its own
few ops, each answering its own query (`search_forks`).

The forks share their base, and all G searches run in the native core without the GIL and with no
Python in between: an exact base is scored from i8 codes of its rows (made once per base, a quarter of
its float32 bytes) and only the rows that the codes' error bound cannot rule out are scored in
float32, as `bank.search` scores them; a graph base gets one walk per query. Each query skips its own
fork's dead base rows and scans its own delta. Ids and scores equal G calls of `bank.search`.
The codes live as long as the base: n x dim bytes, so `exact=True` on a large graph base pays that once.
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
    ids, scores, hits = _core.search_many([core for core, _ in views], queries, k, speaker, rows, graphs, count)
    return [SearchResult(ids[i, :h], scores[i, :h]) for i, h in enumerate(hits.tolist())]
