"""Process group, device mesh and FSDP2 wrapping of a Hugging Face causal LM.

World size 1 without a process group is a first-class case: no FSDP, a plain module, no collectives.
Under torchrun (or after the caller initialised a group) every rank shards each transformer block, then
the root, with `fully_shard` on a 1-D data-parallel mesh: NCCL on CUDA, gloo on CPU.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class Dist:
    rank: int
    world: int
    device: torch.device
    mesh: object | None  # DeviceMesh when a process group exists

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.mesh is not None:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def barrier(self):
        if self.mesh is not None:
            dist.barrier()


def resolve_device(device: str) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} requested but CUDA is not available on this machine "
                         "(torch.cuda.is_available() is False); use device='cpu'")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r} is not supported; use 'cpu' or 'cuda'")
    return dev


def setup(device: str) -> Dist:
    """Join (or create, under torchrun) the default process group and build the data-parallel mesh."""
    dev = resolve_device(device)
    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    if not dist.is_initialized() and env_world > 1:
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    # A world of one needs no sharding; this also keeps a group that an in-process vLLM engine
    # created for itself (world 1) from turning our parameters into DTensors.
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return Dist(0, 1, dev, None)
    rank, world = dist.get_rank(), dist.get_world_size()
    if dev.type == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count())))
        torch.cuda.set_device(dev)
    from torch.distributed.device_mesh import init_device_mesh
    return Dist(rank, world, dev, init_device_mesh(dev.type, (world,), mesh_dim_names=("dp",)))


def attn_implementation(requested: str) -> str:
    """flash_attention_2 where flash-attn is installed, sdpa otherwise (flash-attn can't build on CPU)."""
    if requested != "auto":
        return requested
    return "flash_attention_2" if importlib.util.find_spec("flash_attn") else "sdpa"


def decoder_layers(lm: nn.Module) -> nn.ModuleList:
    base = getattr(lm, lm.base_model_prefix, lm)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(f"{type(lm).__name__} has no `{lm.base_model_prefix}.layers`; cannot shard per block")
    return layers


def shard(root: nn.Module, layers: nn.ModuleList, d: Dist) -> nn.Module:
    """FSDP2: each block, then the root (embeddings, final norm, heads). No-op without a mesh."""
    if d.mesh is None:
        return root
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    # bf16 compute with fp32 master weights and fp32 gradient reduction on GPUs; plain fp32 on CPU.
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if d.device.type == "cuda" else MixedPrecisionPolicy())
    for layer in layers:
        fully_shard(layer, mesh=d.mesh, mp_policy=mp)
    fully_shard(root, mesh=d.mesh, mp_policy=mp)
    return root


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """Gather a (possibly sharded) parameter into one full tensor; a collective under FSDP."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t.detach()
