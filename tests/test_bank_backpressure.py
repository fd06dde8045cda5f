"""Back-pressure on bursts (BankConfig.auto_compact_max_delta, auto_compact_wait_s; compaction.backlog):
ops that come faster than background compactions wait for the one in flight once it is a limit behind,
so compactions commit during a burst, the delta stays under the limit, an op waits a bounded time (then
BankBusy, unapplied), close() waits for one compaction at most, and every acknowledged op is kept."""
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from memr1.memory_store import Add, BankBusy, BankError, InvalidInput, MemoryBank, Noop
from memr1.memory_store.schema import MAX_COUNT

DIM = 4

# A burst in a child process (a hang or a slow close fails the test at the timeout, not the run):
# n_one single applies, then n_batch ops in apply_batch calls of `batch`. Exact search only, so that a
# compaction is cheap and the burst short; without back-pressure its delta still reaches ~n rows.
BURST = r"""
import json, sys, time
import numpy as np
from memr1.memory_store import Add, MemoryBank
path, n_one, n_batch, batch, limit = sys.argv[1], *map(int, sys.argv[2:])
bank = MemoryBank.create(path, dim=4, fsync="never", hnsw_threshold=1 << 30, auto_compact_min_rows=64,
                         auto_compact_max_delta=limit)
vectors = np.random.default_rng(5).standard_normal((n_one + n_batch, 4)).astype(np.float32)
out = {"max_one": 0, "max_batch": 0, "max_threshold": 0}
for i in range(n_one):
    bank.apply(Add(f"m{i}", vectors[i], "AB"[i % 2]))
    out["max_one"] = max(out["max_one"], bank.stats()["delta_rows"])
    out["max_threshold"] = max(out["max_threshold"], bank.auto_compact_at)
for j in range(n_one, n_one + n_batch, batch):
    bank.apply_batch([Add(f"m{i}", vectors[i], "AB"[i % 2]) for i in range(j, j + batch)])
    out["max_batch"] = max(out["max_batch"], bank.stats()["delta_rows"])
out["compactions"] = bank.compactions
start = time.perf_counter()
bank.close()
out["close_s"] = time.perf_counter() - start
print(json.dumps(out))
"""


@pytest.mark.parametrize("n_one,n_batch,batch,limit", [
    (9_000, 3_000, 50, 2_048),
    pytest.param(150_000, 50_000, 100, 8_192, marks=pytest.mark.slow)])
def test_a_burst_commits_compactions_and_keeps_the_delta_under_the_limit(tmp_path, n_one, n_batch, batch, limit):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", BURST, str(tmp_path / "b"), str(n_one), str(n_batch), str(batch),
                           str(limit)], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert 2 * out["max_threshold"] <= limit  # so the limit in force was auto_compact_max_delta throughout
    assert out["max_one"] <= limit + 1  # an op is let in at the limit, not past it
    assert out["max_batch"] <= limit + batch
    assert out["compactions"] >= (n_one + n_batch) // (limit + batch) - 1  # only a commit shrinks the delta
    assert out["close_s"] < 120  # one compaction of the bank at most; generous for a loaded machine
    with MemoryBank.open(tmp_path / "b", "r") as again:  # every acknowledged op, in order
        assert again.stats()["ops"] == n_one + n_batch
        assert {m.id: m.text for m in again} == {i: f"m{i}" for i in range(n_one + n_batch)}


def vector(i: int) -> np.ndarray:
    return np.random.default_rng(i).standard_normal(DIM).astype(np.float32)


def behind(tmp_path, kind: str, **settings) -> MemoryBank:
    """A bank whose compaction (gated) is in flight and a limit behind: 64 delta rows past its snapshot
    (adds), or 64 ops kept since (noops, which add no row but must be replayed too)."""
    bank = MemoryBank.create(tmp_path / "b", dim=DIM, fsync="never", auto_compact_min_rows=16,
                             auto_compact_max_delta=64, **settings)
    for i in range(17):
        bank.apply(Add(f"m{i}", vector(i), "A"))
    assert bank.compacting
    for i in range(17, 17 + (48 if kind == "add" else 65)):  # adds: the delta counts the snapshot's 17 rows too
        bank.apply(Add(f"m{i}", vector(i), "A") if kind == "add" else Noop())
    return bank


@pytest.mark.parametrize("kind", ["add", "noop"])
def test_an_op_waits_for_the_compaction_at_most_auto_compact_wait_s(tmp_path, gate, kind):
    bank = behind(tmp_path, kind, auto_compact_wait_s=0.3)
    ops = bank.stats()["ops"]
    for call in (lambda: bank.apply(Noop()), lambda: bank.apply_batch([Noop(), Noop()])):
        start = time.perf_counter()
        with pytest.raises(BankBusy, match="auto_compact_wait_s=0.3") as e:
            call()
        assert 0.25 < time.perf_counter() - start < 30  # it waited, and not for ever
        assert "\n" not in str(e.value)
        assert bank.stats()["ops"] == ops  # refused whole
    gate.set()
    bank.wait_for_compaction()
    bank.apply(Noop())
    assert bank.compactions >= 1 and bank.stats()["ops"] == ops + 1
    bank.close()
    with MemoryBank.open(tmp_path / "b", "r") as again:
        assert again.stats()["ops"] == ops + 1 and len(again) == (65 if kind == "add" else 17)


def test_a_held_back_op_goes_in_once_the_compaction_commits(tmp_path, gate):
    bank = behind(tmp_path, "add")
    ops, got = bank.stats()["ops"], []
    writer = threading.Thread(target=lambda: got.append(bank.apply(Add("late", vector(99), "A"))), daemon=True)
    writer.start()
    writer.join(0.5)
    assert writer.is_alive() and bank.stats()["ops"] == ops  # held back while the build cannot finish
    gate.set()
    writer.join(60)
    assert not writer.is_alive() and got == [ops]
    assert bank.compactions >= 1 and bank.stats()["delta_rows"] <= 64 + 1
    bank.close()
    with MemoryBank.open(tmp_path / "b", "r") as again:
        assert again.get(ops).text == "late" and len(again) == ops + 1


def test_close_waits_for_the_compaction_in_flight_and_starts_no_other(tmp_path, gate):
    """The ops made during the build leave the bank past its threshold again; close() commits the one
    compaction and keeps them in the new log, rather than waiting for another."""
    bank = MemoryBank.create(tmp_path / "b", dim=DIM, fsync="never", auto_compact_min_rows=16)
    for i in range(60):
        bank.apply(Add(f"m{i}", vector(i), "A"))
    assert bank.compacting and bank.stats()["delta_rows"] > 2 * 16
    closer = threading.Thread(target=bank.close, daemon=True)
    closer.start()
    closer.join(0.3)
    gate.set()
    closer.join(60)
    assert not closer.is_alive()
    assert bank.compactions == 1
    with MemoryBank.open(tmp_path / "b", "r") as again:
        assert again.stats()["ops"] == 60 and {m.id: m.text for m in again} == {i: f"m{i}" for i in range(60)}


@pytest.mark.parametrize("name,value,bound", [("auto_compact_max_delta", MAX_COUNT + 1, f"<= {MAX_COUNT}"),
                                              ("auto_compact_max_delta", 0, ">= 1"),
                                              ("auto_compact_wait_s", 3600.5, "<= 3600.0"),
                                              ("auto_compact_wait_s", -1.0, ">= 0.0")])
def test_the_settings_are_bounded(tmp_path, name, value, bound):
    with pytest.raises(InvalidInput, match=f"bad bank config {name}=.*{bound}") as e:
        MemoryBank.create(tmp_path / "b", dim=DIM, **{name: value})
    assert "\n" not in str(e.value) and not (tmp_path / "b").exists()


def test_the_bench_burst_row_reports_the_bound(tmp_path):
    from memr1.bench.memory_burst import burst_headline, burst_rows
    from memr1.memory_store import BankConfig

    config = BankConfig(dim=384, fsync="never", hnsw_threshold=1 << 30, auto_compact_min_rows=64)
    (r,) = burst_rows(2_000, config, 512, tmp_path)
    assert r["op"] == "burst" and r["n"] == 2_000 and r["delta_limit"] == 512
    assert r["delta_rows"] <= 512 + 1 and r["compacted_during"] >= 2_000 // 513 - 1
    assert r["p99_us"] <= r["max_us"] and r["close_s"] >= 0
    head = {h["name"]: h for h in burst_headline([r])}
    assert head["burst @ 2,000: delta rows past the limit"]["met"]


def test_an_op_after_close_began_is_refused_unapplied(tmp_path, gate):
    """Ops from another thread while close() waits for the compaction in flight would land with no
    compaction left to fold them in: they are refused, one line, and nothing acknowledged is lost."""
    bank = MemoryBank.create(tmp_path / "b", dim=DIM, fsync="never", auto_compact_min_rows=16)
    for i in range(60):
        bank.apply(Add(f"m{i}", vector(i), "A"))
    assert bank.compacting
    closer = threading.Thread(target=bank.close, daemon=True)
    closer.start()
    deadline = time.monotonic() + 30
    while not bank._closing and time.monotonic() < deadline:
        time.sleep(0.01)
    for call in (lambda: bank.apply(Add("late", vector(99), "A")), lambda: bank.apply_batch([Noop()])):
        with pytest.raises(BankError, match="is closing") as e:
            call()
        assert "\n" not in str(e.value)
    gate.set()
    closer.join(60)
    assert not closer.is_alive()
    with MemoryBank.open(tmp_path / "b", "r") as again:
        assert again.stats()["ops"] == 60 and "late" not in {m.text for m in again}
