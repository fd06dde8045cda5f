"""Process group, device mesh and FSDP2 wrapping of a Hugging Face causal LM, and the loop's agreement.

World size 1 without a process group is a first-class case: no FSDP, a plain module, no collectives.
Under torchrun (or after the caller initialised a group) every rank shards each transformer block, then
the root, with `fully_shard` on a 1-D data-parallel mesh: NCCL on CUDA, gloo on CPU.

Data-parallel training: each rank samples and trains its own share of a step's prompts; the loop's
`agree` hook (`agree_rollouts`) makes the ranks agree on each step with scalar all-reduces.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from memr1.rl.records import RolloutFailure


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

    def all_reduce_max(self, t: torch.Tensor) -> torch.Tensor:
        if self.mesh is not None:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
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


_owned = False  # whether init() created the default group (then finish() may destroy it)


def init(device: str) -> tuple[int, int]:
    """(rank, world). Under torchrun (WORLD_SIZE > 1) join the default process group first: a trainer
    does this before it creates vLLM engines, so they join this group instead of making their own."""
    global _owned
    dev = resolve_device(device)
    if not dist.is_initialized() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        if dev.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
        _owned = True
    if not dist.is_initialized():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def setup(device: str) -> Dist:
    """Join (or create, under torchrun) the default process group and build the data-parallel mesh."""
    dev = resolve_device(device)
    rank, world = init(device)
    # A world of one needs no sharding; this also keeps a group that an in-process vLLM engine
    # created for itself (world 1) from turning our parameters into DTensors.
    if world == 1:
        return Dist(0, 1, dev, None)
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


# ---- data-parallel rollouts: the loop's agreement ----
# rollout metrics that add up over ranks (the episode stage's counts among them)
SUMMED = ("response_tokens", "frozen_answers", "completions", "prompts", "episodes", "forks", "bank_ops", "groups_global",
          "groups_local")


def all_reduce(t: torch.Tensor, op: str) -> torch.Tensor:
    """In place over the default group; op is "sum" or "max". NCCL reduces GPU tensors only."""
    dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else t.device
    moved = t.to(dev)
    dist.all_reduce(moved, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    t.copy_(moved.to(t.device))
    return t


def agree_rollouts(item, step: int, rank: int | None = None, world: int | None = None, reduce=all_reduce):
    """Loop.agree for world > 1. Each rank keeps its own rollout (its groups train on that rank); the
    ranks agree, with scalar all-reduces only, on what to do with the step: stop if any rank stopped
    (None), else fail if any rank failed (the lowest failing rank's failure, fatal if any was), else
    train, with the rollout metrics reduced over ranks for the log. Runs in the learner thread, like
    every other collective. `reduce` is the all-reduce (a stand-in in tests)."""
    rank = dist.get_rank() if rank is None else rank
    world = dist.get_world_size() if world is None else world
    failed = isinstance(item, RolloutFailure)
    flags = reduce(torch.tensor([float(item is None), float(failed), float(failed and item.fatal),
                                 -float(rank if failed else world)], dtype=torch.float64), "max")
    stop, fail, fatal, first = flags.tolist()
    if stop:
        return None
    if fail:
        if failed and rank == -int(first):
            item.rank = rank
            return item
        return RolloutFailure(step, None, "", what=f"a rollout failed on rank {-int(first)} (its output has the "
                              f"traceback)", rank=-int(first), fatal=bool(fatal))
    item.metrics = reduce_metrics(item.metrics, world, reduce)
    item.weight_version = -int(reduce(torch.tensor([-float(item.weight_version)], dtype=torch.float64), "max").item())
    return item


def reduce_metrics(m: dict, world: int, reduce=all_reduce) -> dict:
    """Rollout metrics over ranks: counts add up, times (`*_s`) take the slowest rank (what the step
    waited for), rates and means average (every rank rolls out the same number of prompts)."""
    names = sorted(m)
    crc = float(zlib.crc32(" ".join(names).encode()))
    digest = reduce(torch.tensor([crc, -crc], dtype=torch.float64), "max")
    if digest[0] != -digest[1]:
        raise RuntimeError(f"data-parallel ranks logged different rollout metrics; this rank: {names}")
    values = torch.tensor([float(m[k]) for k in names], dtype=torch.float64)
    summed, slowest = reduce(values.clone(), "sum"), reduce(values.clone(), "max")
    return {k: (slowest[i].item() if k.endswith("_s") else summed[i].item() if k in SUMMED
                else summed[i].item() / world) for i, k in enumerate(names)}


def finish() -> None:
    """Leave the process group init() created, at the end of a run. vLLM engines made under
    external_launcher hold sub-groups of it and destroy them at their own teardown; destroying the
    default group first made that raise (docs/install.md), so with vLLM loaded it is left to process exit."""
    global _owned
    if _owned and dist.is_initialized() and "vllm" not in sys.modules:
        dist.destroy_process_group()
        _owned = False
