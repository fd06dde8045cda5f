"""What the kernel tests share: the device/impl grid, skips, and NaN-poisoned output buffers."""
import math

import pytest
import torch

from memr1.kernels._dispatch import interpreting

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
IMPLS = ["torch", "triton"]


def need(device, impl="torch"):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    if impl == "triton" and device == "cpu" and not interpreting():
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1")
    if impl == "triton" and device == "cuda" and interpreting():
        pytest.skip("CUDA Triton cases want compiled kernels: TRITON_INTERPRET=0 (bench/gpu_check.sh)")


@pytest.fixture
def poisoned(monkeypatch):
    """Fill every fresh torch.empty buffer with NaN, so an element a kernel forgets to write shows."""
    real_empty, real_like = torch.empty, torch.empty_like

    def empty(*a, **k):
        t = real_empty(*a, **k)
        return t.fill_(math.nan) if t.is_floating_point() else t

    def empty_like(*a, **k):
        t = real_like(*a, **k)
        return t.fill_(math.nan) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch, "empty_like", empty_like)
