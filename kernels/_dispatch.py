"""Choosing between a Triton kernel and its torch reference.

triton is imported under a guard: without it `jit` leaves the kernel functions as plain Python that
nothing calls, and the package still imports. Under TRITON_INTERPRET=1 the same kernels run on CPU
tensors, which is how the tests exercise them without a GPU. That variable is read when a kernel is
decorated, so it must be set before memr1.kernels is first imported (tests/conftest.py does).
"""
import os
import types

import torch

# Read once, as triton does when the kernels below get decorated at import.
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")

try:
    import triton
    import triton.language as tl

    jit = triton.jit
except ImportError:  # a CPU-only install: only the torch references can run
    triton = None
    tl = types.SimpleNamespace(constexpr=None)  # kernel signatures name tl.constexpr; bodies never run

    def jit(fn):
        return fn

IMPLS = ("auto", "triton", "torch")


def triton_available() -> bool:
    return triton is not None


def interpreting() -> bool:
    """Whether the kernels were decorated under TRITON_INTERPRET=1 (CPU tensors then work)."""
    return _INTERPRET and triton is not None


def resolve_impl(impl: str, device: torch.device) -> str:
    """Return "triton" or "torch" for a tensor on `device`.

    "auto" picks Triton for CUDA tensors when triton imports, the torch reference otherwise.
    "triton" on CPU tensors needs the interpreter; asking for it without one is an error, not a
    silent fallback, so a test can never pass on the wrong path.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "torch":
        return "torch"
    if impl == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    if not triton_available():
        raise RuntimeError("impl='triton' was requested but triton is not installed")
    if device.type != "cuda" and not interpreting():
        raise RuntimeError(
            "impl='triton' on a non-CUDA tensor needs TRITON_INTERPRET=1 set before triton is imported"
        )
    return "triton"


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()
