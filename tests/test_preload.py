"""engine/preload.py: entry points restart once with tcmalloc and Intel OpenMP preloaded."""
import os
import subprocess
import sys
from pathlib import Path

from memr1.engine import preload

CHILD = """
import os, sys
print("before", flush=True)
from memr1.engine.preload import preload
preload()
import torch
x = torch.randn(256, 256)
print("matmul", float((x @ x.T).trace() > 0))
print("maps", open("/proc/self/maps").read().count("\\n"))
for line in open("/proc/self/maps"):
    print("lib", line.split()[-1])
print("blocktime", os.environ.get("KMP_BLOCKTIME"))
"""


def run_child(**env) -> list[str]:
    """CHILD's output lines, started from a clean slate: no preload done or set by the test runner."""
    base = {k: v for k, v in os.environ.items() if k not in (preload.DONE, "MEMR1_PRELOAD", "LD_PRELOAD")}
    out = subprocess.run([sys.executable, "-c", CHILD], env={**base, **env}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.splitlines()


def test_child_restarts_once_with_the_libraries_mapped():
    lines = run_child()
    libs = [Path(p).resolve().name for p in preload.libraries()]  # maps show the file behind a symlink
    mapped = {Path(line.split()[1]).name for line in lines if line.startswith("lib ")}
    assert "matmul 1.0" in lines  # torch computes under the preloaded runtime
    if libs and not preload.shutil.which("nvidia-smi"):
        assert lines.count("before") == 2, "the command runs once more, and only once"
        assert set(libs) <= mapped, f"{libs} not all mapped: {sorted(m for m in mapped if 'lib' in m)[:20]}"
        assert "blocktime 5" in lines
    else:  # nothing to preload here: no restart
        assert lines.count("before") == 1


def test_opt_out_and_no_loop(monkeypatch):
    monkeypatch.setenv("MEMR1_PRELOAD", "0")
    assert preload.wanted() == []
    assert run_child(MEMR1_PRELOAD="0").count("before") == 1
    monkeypatch.delenv("MEMR1_PRELOAD")
    monkeypatch.setenv(preload.DONE, "1")
    assert preload.wanted() == []


def test_already_preloaded_libraries_are_not_added_twice(monkeypatch):
    monkeypatch.delenv(preload.DONE, raising=False)
    monkeypatch.delenv("MEMR1_PRELOAD", raising=False)
    monkeypatch.setattr(preload.shutil, "which", lambda name: None)
    monkeypatch.setenv("LD_PRELOAD", ":".join(preload.libraries()))
    assert preload.wanted() == []
