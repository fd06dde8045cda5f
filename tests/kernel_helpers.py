"""What the kernel tests share: the device/impl grid and its skips."""
import os

import pytest
import torch

from memr1.kernels._dispatch import interpreting, native_available

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
IMPLS = ["torch", "triton"]
GRPO_IMPLS = GAE_IMPLS = IMPLS + ["native"]  # grpo_advantage and gae also have a C++ CPU path


def need(device, impl="torch"):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    if impl == "native" and device == "cuda":
        pytest.skip("the native path is for CPU tensors")
    if impl == "native" and not native_available():
        # Every install builds it, so a missing module fails; only bench/gpu_check.sh, which runs the
        # tests from an unbuilt checkout on purpose, says so and skips.
        if os.environ.get("MEMR1_NATIVE_UNBUILT") != "1":
            pytest.fail("memr1.kernels._native is not built (pip install -e . builds it)")
        pytest.skip("native kernels not built in this checkout (MEMR1_NATIVE_UNBUILT=1)")
    if impl == "triton" and device == "cpu" and not interpreting():
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1")
    if impl == "triton" and device == "cuda" and interpreting():
        pytest.skip("CUDA Triton cases want compiled kernels: TRITON_INTERPRET=0 (bench/gpu_check.sh)")
