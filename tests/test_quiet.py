"""engine.quiet: by default vLLM's INFO lines and the known-harmless warnings reach only RUN_DIR/run.log,
any other warning still reaches the terminal; --verbose changes nothing. Each case runs in its own
process, since the policy is process-wide."""
import subprocess
import sys

SCRIPT = """
import logging, sys, warnings
from pathlib import Path
from memr1.engine.observe import quiet
quiet.setup(loud=sys.argv[2] == "loud")
quiet.log_to(Path(sys.argv[1]))
log = logging.getLogger("vllm.model_executor.models.utils")
log.info("Resolved architecture: LlamaForCausalLM")
log.warning("Attempted to load weight x with dtype torch.float32 into parameter with dtype torch.bfloat16")
log.warning("KV cache is nearly full")
warnings.warn("`torch.distributed.reduce_op` is deprecated, please use ReduceOp", FutureWarning)
warnings.warn("something new and worth seeing", UserWarning)
"""


def run(tmp_path, mode):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), mode], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "MEMR1_VERBOSE": "0"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    log = tmp_path / "run.log"
    return proc.stdout + proc.stderr, log.read_text() if log.is_file() else ""


def test_quiet_terminal_keeps_everything_in_the_run_log(tmp_path):
    terminal, log = run(tmp_path, "quiet")
    assert "KV cache is nearly full" in terminal and "something new and worth seeing" in terminal
    for noise in ("Resolved architecture", "Attempted to load weight", "reduce_op"):
        assert noise not in terminal and noise in log, noise
    assert "KV cache is nearly full" in log


def test_verbose_leaves_the_libraries_alone(tmp_path):
    terminal, log = run(tmp_path, "loud")
    assert "reduce_op" in terminal and "something new" in terminal and log == ""
