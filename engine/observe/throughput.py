"""Where a run's time went, from its metrics.jsonl rows: seconds and share of wall time per phase,
tokens/s per phase, rollouts/s, bank ops/s and forks/s, and the learner's MFU on a GPU.

Phases, as the loop and the stages log them (seconds per step):
  generate  gen_s        the policy's sampling (producer thread)
  score     score_s      forks + ops applied, the frozen answers, rewards (producer thread)
  train     train_s      the learner step
  sync      sync_s + sync_wait_s   weight export and load into the generator
  validate  val_s        loop.validate_every
The producer's phases run beside the learner's when loop.max_staleness > 0, so the shares can add to
more than 1; "other" is the wall time no phase explains (0 when they overlap).

MFU = model FLOPs / (train_s x peak bf16 FLOP/s of the learner's GPUs), with model FLOPs = 6 x
(non-embedding + lm_head params) x trained positions (bench/gpu_learner.py's convention: no attention
term, no activation-checkpointing recompute). The learner logs both numbers; on CPU it logs no peak.
"""

# Dense bf16 tensor-core peak per GPU, FLOP/s (vendor datasheets, no sparsity); first match wins.
BF16_PEAK = (("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("GH200", 989e12), ("H200", 989e12),
             ("H100", 989e12), ("B200", 2250e12), ("A100", 312e12), ("L40S", 362e12), ("L40", 181e12),
             ("L4", 121e12))

PHASES = {"generate": ("gen_s",), "score": ("score_s",), "train": ("train_s",),
          "sync": ("sync_s", "sync_wait_s"), "validate": ("val_s",)}


def native_bf16(device: str = "cpu") -> bool:
    """Whether `device` multiplies bf16 natively: a CUDA GPU that supports it, or a CPU with AMX or
    AVX512-BF16 (on other CPUs bf16 is emulated and slower than fp32). What the "fast" precision
    settings (generator.dtype, learner.cpu_precision) resolve by."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    try:
        flags = next((line for line in open("/proc/cpuinfo") if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def bf16_peak(device_name: str) -> float | None:
    for key, peak in BF16_PEAK:
        if key in device_name:
            return peak
    return None


def _num(r: dict, key: str) -> float:
    v = r.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def total(rows: list[dict], key: str) -> float:
    return sum(_num(r, key) for r in rows)


def phase_seconds(r: dict) -> dict[str, float]:
    """One step's seconds per phase, and "other": the wall time left over (never negative)."""
    out = {name: sum(_num(r, k) for k in keys) for name, keys in PHASES.items()}
    out["other"] = max(0.0, _num(r, "step_s") - sum(out.values()))
    return out


def _rate(num: float, den: float) -> float | None:
    return num / den if den > 0 and num > 0 else None


def summarize(rows: list[dict], device: str = "cpu") -> dict:
    """The throughput summary of one stage's (or a whole run's) trained steps."""
    wall = total(rows, "step_s")
    phases = {name: 0.0 for name in (*PHASES, "other")}
    for r in rows:
        for name, s in phase_seconds(r).items():
            phases[name] += s
    out = {
        "steps": len(rows), "wall_s": wall,
        "phase_s": phases, "phase_share": {k: (v / wall if wall else None) for k, v in phases.items()},
        "tokens_per_s": {
            "generate": _rate(total(rows, "response_tokens"), total(rows, "gen_s")),
            "frozen_answers": _rate(total(rows, "frozen_tokens"), total(rows, "frozen_s")),
            "train": _rate(total(rows, "positions"), total(rows, "train_s")),
        },
        "sync_gb_per_s": _rate(total(rows, "sync_bytes") / 1e9, total(rows, "sync_s")),
        "rollouts_per_s": _rate(total(rows, "completions"), wall),
        "forks_per_s": _rate(total(rows, "forks"), wall),
        "bank_ops_per_s": _rate(total(rows, "bank_ops"), wall),
        "bank_ops_per_apply_s": _rate(total(rows, "bank_ops"), total(rows, "fork_s")),
    }
    gpu = [r for r in rows if _num(r, "peak_flops") > 0 and _num(r, "train_s") > 0]
    if gpu:
        out["mfu"] = total(gpu, "model_flops") / sum(_num(r, "train_s") * _num(r, "peak_flops") for r in gpu)
        out["mfu_note"] = "model FLOPs / (train_s x bf16 peak of the learner's GPUs)"
    else:
        out["mfu"] = None
        out["mfu_note"] = ("n/a: the learner ran on the CPU" if not device.startswith("cuda") else
                           "n/a: the GPU's bf16 peak is not in engine/observe/throughput.py's table")
    return out
