"""Start CPU runs with tcmalloc and Intel OpenMP preloaded, the setup vLLM documents for its CPU backend.

Measured on a 2-core AVX2 EPYC (`python -m memr1.bench.rollout`): a full-model vLLM weight update
took 340–480 ms with both preloaded against 540–750 ms without, because vLLM's layer-by-layer reload
allocates and frees every weight; decoding was a few percent faster as well.

LD_PRELOAD is read only when a process starts, so entry points call `preload()` first; it executes
the same command again, once, with the libraries added. It does nothing on machines with an NVIDIA
driver, when neither library is installed, or with MEMR1_PRELOAD=0."""
import os
import shutil
import sys
from pathlib import Path

DONE = "_MEMR1_PRELOADED"  # set in the re-executed process, so it never loops
TCMALLOC = "libtcmalloc_minimal.so.4"


def libraries() -> list[str]:
    """tcmalloc (the Makefile unpacks Debian's into the venv; a system copy also counts) and the
    libiomp5 that the intel-openmp wheel puts in the venv."""
    venv_lib = Path(sys.prefix) / "lib"
    found = []
    for candidates in ([venv_lib / "tcmalloc" / TCMALLOC, Path("/usr/lib/x86_64-linux-gnu") / TCMALLOC,
                        Path("/usr/lib64") / TCMALLOC],
                       [venv_lib / "libiomp5.so"]):
        found += [str(p) for p in candidates if p.is_file()][:1]
    return found


def wanted() -> list[str]:
    """The libraries to add to LD_PRELOAD here; empty when preloading does not apply."""
    if os.environ.get("MEMR1_PRELOAD", "1") == "0" or os.environ.get(DONE) or shutil.which("nvidia-smi"):
        return []
    current = os.environ.get("LD_PRELOAD", "")
    return [lib for lib in libraries() if Path(lib).name not in current]


def preload() -> None:
    libs = wanted()
    if not libs:
        return
    env = dict(os.environ, LD_PRELOAD=":".join(filter(None, [*libs, os.environ.get("LD_PRELOAD")])))
    env[DONE] = "1"
    # Intel OpenMP spins 200 ms after each parallel region by default; the actor-learner loop runs two
    # thread teams on the same cores, so an idle team would steal the other's cycles.
    env.setdefault("KMP_BLOCKTIME", "5")  # what vLLM sets for its own CPU workers
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
