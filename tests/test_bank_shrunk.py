"""A reader whose mapped vectors or graph file is truncated under it (a copy over a live bank truncates
each file in place) gets a BankFormatError from its next search, not SIGBUS. Run in a subprocess, where a SIGBUS
shows as a failed test rather than the end of the test run."""
import subprocess
import sys

import pytest

SCRIPT = """
import os, sys
import numpy as np
from memr1.memory_store import Add, BankFormatError, MemoryBank
path, mode, cut, exact, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "exact", sys.argv[5]
vectors = np.random.default_rng(0).standard_normal((2000, 16)).astype(np.float32)
MemoryBank.from_arrays(path, vectors, ["m"] * 2000, ["AB"[i % 2] for i in range(2000)], ["t"] * 2000,
                       hnsw_threshold=500).close()
bank = MemoryBank.open(path, mode)
assert bank.search(vectors[5], k=1).ids.tolist() == [5]
os.truncate(os.path.join(path, "base-0", name), cut)
for speaker in (None, "B"):
    try:
        bank.search(vectors[5], k=3, speaker=speaker, exact=exact)
    except BankFormatError as e:
        assert "\\n" not in str(e) and name in str(e), e
        print("REFUSED", e)
    else:
        print("SEARCHED")
try:
    bank.fork().search(vectors[5], k=1, exact=exact)
except BankFormatError:
    print("FORK REFUSED")
"""


@pytest.mark.parametrize("mode", ["r", "rw"])
@pytest.mark.parametrize("cut", [0, 4096])
@pytest.mark.parametrize("exact", ["exact", "graph"])
def test_a_truncated_vectors_file_is_an_error_not_sigbus(tmp_path, mode, cut, exact):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "b"), mode, str(cut), exact, "vectors.f32"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])   # -7: SIGBUS
    assert out.stdout.count("REFUSED") == 3, out.stdout


@pytest.mark.parametrize("graph", ["hnsw-0.usearch", "hnsw-1.usearch"])
def test_a_truncated_graph_file_is_an_error_not_sigbus(tmp_path, graph):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "b"), "r", "4096", "graph", graph],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])   # -7: SIGBUS
    assert out.stdout.count("REFUSED") == 3, out.stdout
