"""Choosing between a Triton kernel, a native CPU kernel and the torch reference.

triton is imported under a guard: without it `jit` leaves the kernel functions as plain Python that
nothing calls, and the package still imports. Under TRITON_INTERPRET=1 the same kernels run on CPU
tensors, which is how the tests exercise them without a GPU. That variable is read when a kernel is
decorated, so it must be set before memr1.kernels is first imported (tests/conftest.py does).
"""
import os
import types
import warnings

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

try:  # registers the C++ CPU operators (kernels/csrc) built by setup.py; an unbuilt tree lacks them
    from memr1.kernels import _native
except ModuleNotFoundError:
    _native = None
except ImportError as e:  # built, but against another torch: say so rather than run 3x slower quietly
    _native = None
    warnings.warn(f"memr1.kernels._native does not load ({e}); CPU grpo_advantage falls back to the torch "
                  "reference until it is rebuilt (pip install --no-build-isolation -e .)", stacklevel=2)

IMPLS = ("auto", "triton", "torch", "native")


def triton_available() -> bool:
    return triton is not None


def native_available() -> bool:
    return _native is not None


def interpreting() -> bool:
    """Whether the kernels were decorated under TRITON_INTERPRET=1 (CPU tensors then work)."""
    return _INTERPRET and triton is not None


def resolve_impl(impl: str, device: torch.device, native: bool = False) -> str:
    """Return "triton", "native" or "torch" for a tensor on `device`; `native`: whether the kernel
    has a C++ CPU path (grpo_advantage, gae).

    "auto" picks Triton for CUDA tensors when triton imports, the native path for CPU tensors when the
    kernel has one and it is built, the torch reference otherwise. An explicit "triton" or "native"
    that cannot run is an error, not a silent fallback, so a test can never pass on the wrong path.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "torch":
        return "torch"
    if impl == "auto":
        if device.type == "cuda" and triton_available():
            return "triton"
        return "native" if native and device.type == "cpu" and native_available() else "torch"
    if impl == "native":
        if not native:
            raise ValueError("impl='native' is not offered by this kernel; use auto, triton or torch")
        if device.type != "cpu":
            raise ValueError(f"impl='native' runs on CPU tensors, got a {device.type} tensor")
        if not native_available():
            raise RuntimeError("impl='native' was requested but memr1.kernels._native is not built "
                               "(pip install -e . builds it)")
        return "native"
    if not triton_available():
        raise RuntimeError("impl='triton' was requested but triton is not installed")
    if device.type != "cuda" and not interpreting():
        raise RuntimeError(
            "impl='triton' on a non-CUDA tensor needs TRITON_INTERPRET=1 set before triton is imported"
        )
    return "triton"


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()
