"""What the kernel tests share: the device/impl grid and its skips."""
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
