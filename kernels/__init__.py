"""Numeric kernels of the trainer: each a Triton kernel plus the torch reference it is tested against;
grpo_advantage also has a C++ path for CPU tensors (csrc/, built by setup.py).

Dispatch (`impl="auto"`): Triton for CUDA tensors; for CPU tensors the C++ path where a kernel has
one, else the torch reference. `impl="triton"` also runs on CPU tensors under TRITON_INTERPRET=1,
which is how the tests check the kernels.
"""
from memr1.kernels.gae import gae, gae_ref
from memr1.kernels.grpo_advantage import grpo_advantage, grpo_advantage_ref
from memr1.kernels.logprobs import logprobs, logprobs_ref

__all__ = ["gae", "gae_ref", "grpo_advantage", "grpo_advantage_ref", "logprobs", "logprobs_ref"]
