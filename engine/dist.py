"""Process group, device mesh and FSDP2 wrapping of a Hugging Face causal LM, and the loop's gather.

World size 1 without a process group is a first-class case: no FSDP, a plain module, no collectives.
Under torchrun (or after the caller initialised a group) every rank shards each transformer block, then
the root, with `fully_shard` on a 1-D data-parallel mesh: NCCL on CUDA, gloo on CPU.

Data-parallel training: each rank samples its share of a step's prompts; `gather_rollouts` (the loop's
`gather` hook) all-gathers the ranks' rollouts into the one global TrainBatch every learner rank needs.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
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


# ---- data-parallel rollouts: the loop's gather ----
def gather_rollouts(item):
    """Loop.gather for world > 1: all-gather every rank's rollout of this step (in rank order) and
    return what all ranks then agree on: None if any rank stopped, else the first failure, else one
    Rollout of the global batch. Runs in the learner thread, like every other collective."""
    from memr1.engine.loop import RolloutFailure

    rank = dist.get_rank()
    sent = item
    if isinstance(item, RolloutFailure):  # an exception may not pickle; its text travels instead
        sent = dataclasses.replace(item, error=None, rank=rank)
    items = [None] * dist.get_world_size()
    dist.all_gather_object(items, sent)
    out = merge_rollouts(items)
    if isinstance(out, RolloutFailure) and out.rank == rank:
        out.error = item.error  # our own: keep the exception for the traceback chain
    return out


def merge_rollouts(items: list):
    """The step's item from each rank's, in rank order (see gather_rollouts)."""
    from memr1.engine.loop import Rollout, RolloutFailure

    if any(it is None for it in items):
        return None
    failures = [it for it in items if isinstance(it, RolloutFailure)]
    if failures:
        return min(failures, key=lambda f: not f.fatal)  # a dead producer first, else the lowest rank
    steps = {it.step for it in items}
    if len(steps) > 1:  # would mean the ranks' producers walk different data: never train on that
        raise RuntimeError(f"data-parallel ranks produced different steps {sorted(steps)} for one learner step")
    return Rollout(merge_batches([it.batch for it in items]), merge_metrics([it.metrics for it in items]),
                   step=items[0].step, weight_version=min(it.weight_version for it in items))


def merge_batches(batches: list):
    """Concatenate TrainBatches in rank order; group ids are offset so each rank's groups stay distinct."""
    cat = lambda ts: torch.cat(ts) if ts and all(t is not None for t in ts) else None
    groups, offset = [], 0
    for b in batches:
        if b.group_ids is not None:
            groups.append(b.group_ids + offset)
            offset += int(b.group_ids.max()) + 1 if len(b.group_ids) else 0
    behav = [b.behav_logp for b in batches]
    return dataclasses.replace(
        batches[0], input_ids=[t for b in batches for t in b.input_ids],
        response_mask=[t for b in batches for t in b.response_mask],
        behav_logp=None if any(x is None for x in behav) else [t for x in behav for t in x],
        advantages=cat([b.advantages for b in batches]), rewards=cat([b.rewards for b in batches]),
        group_ids=cat(groups) if len(groups) == len(batches) else None,
        weight_version=min(b.weight_version for b in batches))


def merge_metrics(ms: list[dict]) -> dict:
    """Rates and means average over ranks (every rank has the same number of rollouts); token counts
    add up; times (`*_s`) take the slowest rank, which is what the step waited for."""
    out = {}
    for k in dict.fromkeys(k for m in ms for k in m):
        vals = [m[k] for m in ms if k in m]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            out[k] = vals[0]
        elif k == "response_tokens":
            out[k] = sum(vals)
        elif k.endswith("_s"):
            out[k] = max(vals)
        else:
            out[k] = sum(vals) / len(vals)
    return out


def finish() -> None:
    """Leave the process group init() created, at the end of a run. vLLM engines made under
    external_launcher hold sub-groups of it and destroy them at their own teardown; destroying the
    default group first made that raise (ENVIRONMENT.md), so with vLLM loaded it is left to process exit."""
    global _owned
    if _owned and dist.is_initialized() and "vllm" not in sys.modules:
        dist.destroy_process_group()
        _owned = False
