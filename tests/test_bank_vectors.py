"""What an op carries is checked on a private copy before anything is logged: a vector another thread
changes meanwhile, a byte-swapped or out-of-range vector, an oversized speaker or timestamp, a write
from inside apply_batch's own ops. Each is refused whole, and the bank still opens with exactly the
ops that were acknowledged."""
import mmap
import os
import signal
import time

import numpy as np
import pytest

from memr1.memory_store import Add, BankError, InvalidInput, MemoryBank, Noop, Update, _core
from memr1.memory_store.schema import MAX_NORM, MAX_SPEAKER_BYTES, MAX_TIMESTAMP_BYTES, MIN_NORM

DIM = 16


def unit(seed: int, dim: int = DIM) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


def test_vector_changed_while_apply_runs_is_never_logged_non_finite(tmp_path):
    # Another process flips the first element of the caller's (shared) array between a value and NaN with no
    # lock at all, as a thread writing without the GIL would. What apply validates must be exactly what it
    # logs and stores: before the copy, NaNs slipped in between the check and the log, and the bank's
    # log could no longer be replayed.
    dim = 1024
    good = unit(1, dim)
    buf = mmap.mmap(-1, dim * 4)
    shared = np.frombuffer(buf, np.float32)
    shared[:] = good
    pid = os.fork()
    if pid == 0:
        try:
            while True:
                shared[0] = np.nan
                shared[0] = good[0]
        finally:
            os._exit(0)
    bank = MemoryBank.create(tmp_path / "b", dim=dim, fsync="never", auto_compact_ratio=0)
    acked = refused = 0
    deadline = time.monotonic() + 60
    try:  # until both outcomes are common (the flipper may be descheduled for a while on a busy machine)
        while min(acked, refused) < 5000 and acked + refused < 200_000 and time.monotonic() < deadline:
            try:
                bank.apply(Add("m", shared, "A"))
                acked += 1
            except InvalidInput:
                refused += 1
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert acked and refused, (acked, refused)
    bank.close()
    bank = MemoryBank.open(tmp_path / "b", "r")
    assert len(bank) == acked
    assert np.isfinite(bank._core.live_rows().vectors()).all()


@pytest.mark.parametrize("vector, fragment", [
    (unit(2).astype(">f4"), "native-endian float32"),
    (np.full(DIM, 3e38, np.float32), "outside [2**-32, 2**32]"),
    (np.full(DIM, 1e-40, np.float32), "outside [2**-32, 2**32]"),  # denormals
])
def test_vectors_whose_scores_would_be_wrong_are_refused(tmp_path, vector, fragment):
    bank = MemoryBank.create(tmp_path / "b", dim=DIM)
    bank.apply(Add("m", unit(3), "A"))
    for call in (lambda: bank.apply(Add("x", vector, "A")), lambda: bank.apply(Update(0, "x", vector)),
                 lambda: bank.search(vector, 3)):
        with pytest.raises(InvalidInput, match=fragment.replace("[", r"\[").replace("*", r"\*")):
            call()
    assert bank.stats()["ops"] == 1
    if vector.dtype.isnative:
        with pytest.raises(InvalidInput, match="outside"):
            MemoryBank.from_arrays(None, vector[None], ["m"], ["A"], ["t"])


@pytest.mark.parametrize("query", [unit(9).astype(">f4"), np.full(DIM, 3e38, np.float32)])
def test_bad_query_is_refused_before_the_hnsw_index_reads_it(query):
    vectors = np.stack([unit(i) for i in range(40)])
    bank = MemoryBank.from_arrays(None, vectors, ["m"] * 40, ["A"] * 40, ["t"] * 40, hnsw_threshold=8)
    assert bank.stats()["hnsw_speakers"] == ["A"]
    with pytest.raises(InvalidInput):
        bank.search(query, 3)


def test_vectors_at_the_norm_bounds_score_finite_cosines():
    bank = MemoryBank.create(None, dim=DIM)
    small, large = unit(4) * np.float32(MIN_NORM * 1.01), unit(5) * np.float32(MAX_NORM * 0.99)
    bank.apply(Add("small", small, "A"))
    bank.apply(Add("large", large, "A"))
    for q in (small, large, unit(6)):
        got = bank.search(q, 2, exact=True)
        want = [float(np.dot(q.astype(np.float64), v) / np.linalg.norm(q.astype(np.float64)) /
                      np.linalg.norm(v.astype(np.float64))) for v in (small, large)]
        assert np.allclose(sorted(got.scores.tolist()), sorted(want), atol=1e-5)


def test_strided_vector_is_stored_as_its_values():
    bank = MemoryBank.create(None, dim=DIM)
    wide = np.stack([unit(7), unit(8)], axis=1)  # column 0 is a strided view
    i = bank.apply(Add("m", wide[:, 0], "A"))
    got = bank.search(unit(7), 1)
    assert got.ids.tolist() == [i] and abs(got.scores[0] - 1) < 1e-6


def test_python_and_native_bounds_agree():
    assert (MAX_SPEAKER_BYTES, MAX_TIMESTAMP_BYTES) == (_core.MAX_SPEAKER_BYTES, _core.MAX_TIMESTAMP_BYTES)
    assert (MIN_NORM, MAX_NORM) == (_core.MIN_NORM, _core.MAX_NORM)


def test_speaker_and_timestamp_sizes_are_bounded(tmp_path):
    bank = MemoryBank.create(tmp_path / "b", dim=DIM)
    bank.apply(Add("m", unit(1), "s" * MAX_SPEAKER_BYTES, "t" * MAX_TIMESTAMP_BYTES))  # at the limits
    refused = [Add("m", unit(1), "s" * (MAX_SPEAKER_BYTES + 1)),
               Add("m", unit(1), "A", "t" * (MAX_TIMESTAMP_BYTES + 1)),
               Update(0, "m", unit(1), "t" * (MAX_TIMESTAMP_BYTES + 1))]
    for op in refused:
        with pytest.raises(InvalidInput, match="over the limit"):
            bank.apply(op)
    with pytest.raises(InvalidInput, match="over the limit"):
        MemoryBank.from_arrays(None, unit(1)[None], ["m"], ["s" * (MAX_SPEAKER_BYTES + 1)], ["t"])
    assert bank.stats()["ops"] == 1
    bank.close()
    assert MemoryBank.open(tmp_path / "b", "r").stats()["ops"] == 1


@pytest.mark.parametrize("write", ["apply", "apply_batch", "compact", "close"])
def test_write_from_inside_apply_batch_is_refused(tmp_path, write):
    bank = MemoryBank.create(tmp_path / "b", dim=DIM)
    bank.apply(Add("first", unit(1), "A"))

    def ops():
        yield Add("batched", unit(2), "A")
        {"apply": lambda: bank.apply(Add("inner", unit(3), "A")), "apply_batch": lambda: bank.apply_batch([Noop()]),
         "compact": bank.compact, "close": bank.close}[write]()
        yield Noop()

    with pytest.raises(BankError, match="inside its own apply_batch"):
        bank.apply_batch(ops())
    assert [m.text for m in bank] == ["first"] and bank.stats()["ops"] == 1
    bank.apply_batch([Add("after", unit(4), "A")])  # the bank still takes batches
    bank.close()
    bank = MemoryBank.open(tmp_path / "b", "r")
    assert [m.text for m in bank] == ["first", "after"] and bank.stats()["ops"] == 2


def test_search_speaker_that_is_not_utf8_is_invalid_input():
    bank = MemoryBank.create(None, dim=DIM)
    bank.apply(Add("m", unit(1), "A"))
    with pytest.raises(InvalidInput, match="speaker is not encodable"):
        bank.search(unit(1), 3, speaker="\ud800")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_distinct_speaker_filters_are_not_kept():
    # A filter for a speaker no memory has matches nothing, and must cost nothing once the search is
    # over: 100k distinct 200-byte filters kept would be ~40 MB.
    bank = MemoryBank.create(None, dim=DIM)
    bank.apply(Add("m", unit(1), "A"))
    q = unit(2)
    for i in range(2_000):  # warm up allocator pools
        bank.search(q, 1, speaker=f"{i:0200d}")
    before = rss()
    for i in range(2_000, 102_000):
        assert len(bank.search(q, 1, speaker=f"{i:0200d}").ids) == 0
    assert rss() - before < 8 << 20, f"{(rss() - before) >> 20} MiB kept"
    assert bank.search(q, 1, speaker="A").ids.tolist() == [0]
