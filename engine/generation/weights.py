"""Weight updates: check a whole named-tensor set against the model before touching anything, then
move it in bounded buckets so the receiver never holds a second full copy of the model."""
import json
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

# Names a checkpoint may carry as an alias of another tensor (tied embeddings): accepted and skipped.
TIED_ALIASES = {"lm_head.weight": "model.embed_tokens.weight"}


def checkpoint_manifest(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in a safetensors checkpoint, read from the file headers only."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir} holds no *.safetensors files")
    shapes = {}
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, info in header.items():
            if name != "__metadata__":
                shapes[name] = tuple(info["shape"])
    return shapes


def check_named_tensors(named_tensors: Iterable[tuple[str, torch.Tensor]],
                        expected: dict[str, tuple[int, ...]],
                        aliases: dict[str, str] | None = None) -> list[tuple[str, torch.Tensor]]:
    """Return the tensors to load (aliases dropped) or raise ValueError naming every problem.

    An update must be complete: a missing name is an error, because a partial set would leave the
    generator on a mix of two policies. Only references are collected here, no copies."""
    aliases = TIED_ALIASES if aliases is None else aliases
    problems, seen, keep = [], set(), []
    for item in named_tensors:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise ValueError(f"update_weights wants (name, tensor) pairs, got {type(item).__name__}")
        name, t = item
        if not isinstance(t, torch.Tensor):
            problems.append(f"{name}: not a tensor ({type(t).__name__})")
            continue
        if name in seen:
            problems.append(f"{name}: given twice")
            continue
        seen.add(name)
        target = name if name in expected else aliases.get(name)
        if target not in expected:
            problems.append(f"{name}: no such weight in the model")
        elif tuple(t.shape) != expected[target]:
            problems.append(f"{name}: shape {tuple(t.shape)} != model's {expected[target]}")
        elif not t.is_floating_point():
            problems.append(f"{name}: dtype {t.dtype} is not floating point")
        elif name == target:
            keep.append((name, t))
    missing = sorted(set(expected) - seen)
    if missing:
        problems.append(f"missing {len(missing)} weights, e.g. {missing[:3]}")
    if problems:
        shown = "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more" if len(problems) > 6 else "")
        raise ValueError(f"update_weights refused, nothing was loaded: {shown}")
    return keep


def buckets(named_tensors: list[tuple[str, torch.Tensor]], bucket_mb: int, device: torch.device,
            dtype: torch.dtype) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Yield lists of tensors moved to the receiver's device and dtype, about bucket_mb at a time.
    A tensor already there is passed through without a copy."""
    limit = bucket_mb * 2**20
    bucket, size = [], 0
    for name, t in named_tensors:
        bucket.append((name, t.detach().to(device=device, dtype=dtype).contiguous()))
        size += t.numel() * dtype.itemsize
        if size >= limit:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


def stream(named_tensors: list[tuple[str, torch.Tensor]], bucket_mb: int, device: torch.device,
           dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """The buckets flattened into one iterator; each bucket is dropped once consumed."""
    for bucket in buckets(named_tensors, bucket_mb, device, dtype):
        yield from bucket
        del bucket
