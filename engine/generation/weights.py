"""Weight updates: check a named-tensor set against the model before touching anything, then move it
in bounded buckets so the receiver never holds a second full copy of the model.

Two ways in:
- A list (or any iterable) without a manifest: every reference is collected and checked before the
  first load. Fine for tensors that already exist (a state_dict), but a producer that builds each
  tensor on demand (an FSDP learner gathering full parameters) would be materialised whole.
- A stream with a manifest (name -> full shape, known up front): the manifest is checked before the
  first tensor is drawn, then each tensor is checked as it arrives and dropped once loaded.
`push_weights` is the one path from a learner to a generator, and takes the second way.
"""
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from memr1.rl.fileio import safetensors_header

# Names a checkpoint may carry as an alias of another tensor (tied embeddings): accepted and skipped.
TIED_ALIASES = {"lm_head.weight": "model.embed_tokens.weight"}
# peft's names in an adapted model (the learner's with LoRA, and an HF generator holding adapters): a
# target `...q_proj.weight` becomes `...q_proj.base_layer.weight` beside `...q_proj.lora_A.default.weight`
# and `...lora_B.default.weight`.
PEFT_BASE = ".base_layer"


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def hf_name(name: str) -> str:
    """A parameter's name in the model without adapters."""
    return name.replace(PEFT_BASE + ".", ".")


def checkpoint_manifest(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in a safetensors checkpoint, read from the file headers only."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir} holds no *.safetensors files")
    shapes = {}
    for f in files:
        try:
            header = safetensors_header(f)
        except (OSError, ValueError) as e:   # damaged: a tampered length, not JSON, a missing member
            raise ValueError(f"{f}: not a whole safetensors file ({e})") from None
        for name, info in header.items():
            if name != "__metadata__":
                shapes[name] = tuple(info["shape"])
    return shapes


def refused(problems: list[str]) -> ValueError:
    shown = "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more" if len(problems) > 6 else "")
    return ValueError(f"update_weights refused, nothing was loaded: {shown}")


def unpack(item) -> tuple[str, object]:
    if not (isinstance(item, tuple) and len(item) == 2):
        raise ValueError(f"update_weights wants (name, tensor) pairs, got {type(item).__name__}")
    return item


def shape_problem(name: str, shape: tuple[int, ...], expected: dict[str, tuple[int, ...]],
                  aliases: dict[str, str]) -> str | None:
    target = name if name in expected else aliases.get(name)
    if target not in expected:
        return f"{name}: no such weight in the model"
    if shape != expected[target]:
        return f"{name}: shape {shape} != model's {expected[target]}"
    return None


def tensor_problem(name: str, t, expected: dict[str, tuple[int, ...]], aliases: dict[str, str]) -> str | None:
    if not isinstance(t, torch.Tensor):
        return f"{name}: not a tensor ({type(t).__name__})"
    problem = shape_problem(name, tuple(t.shape), expected, aliases)
    if problem is None and not t.is_floating_point():
        problem = f"{name}: dtype {t.dtype} is not floating point"
    return problem


def check_named_tensors(named_tensors: Iterable[tuple[str, torch.Tensor]],
                        expected: dict[str, tuple[int, ...]],
                        aliases: dict[str, str] | None = None) -> list[tuple[str, torch.Tensor]]:
    """Return the tensors to load (aliases dropped) or raise ValueError naming every problem.

    An update must be complete: a missing name is an error, because a partial set would leave the
    generator on a mix of two policies. Only references are collected, no copies; but it holds a
    reference to EVERY tensor at once, so a producer that makes tensors on demand (an FSDP learner
    gathering full parameters) must be streamed with a manifest instead (ManifestStream)."""
    aliases = TIED_ALIASES if aliases is None else aliases
    problems, seen, keep = [], set(), []
    for item in named_tensors:
        name, t = unpack(item)
        if name in seen:
            problems.append(f"{name}: given twice")
            continue
        seen.add(name)
        problem = tensor_problem(name, t, expected, aliases)
        if problem:
            problems.append(problem)
        elif name in expected:
            keep.append((name, t))
    missing = sorted(set(expected) - seen)
    if missing:
        problems.append(f"missing {len(missing)} weights, e.g. {missing[:3]}")
    if problems:
        raise refused(problems)
    return keep


def check_manifest(manifest: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]],
                   aliases: dict[str, str]) -> dict[str, tuple[int, ...]]:
    """The manifest with tuple shapes, or ValueError under the same rules as check_named_tensors."""
    if not isinstance(manifest, dict):
        raise ValueError(f"update_weights manifest must be a dict name -> shape, got {type(manifest).__name__}")
    shapes = {name: tuple(int(d) for d in shape) for name, shape in manifest.items()}
    problems = [p for name, shape in shapes.items() if (p := shape_problem(name, shape, expected, aliases))]
    missing = sorted(set(expected) - set(shapes))
    if missing:
        problems.append(f"manifest misses {len(missing)} weights, e.g. {missing[:3]}")
    if problems:
        raise refused(problems)
    return shapes


class ManifestStream:
    """A lazy named-tensor stream checked against its manifest.

    The manifest is checked against the model on construction, before anything is drawn, so a bad
    one raises and loads nothing. Then each tensor is checked as it arrives; aliases are dropped.
    A stream that breaks its manifest half-way has already been partly loaded, which cannot be
    undone: iteration just ends and the problem is kept for `raise_if_broken()`. Ending (rather than
    raising into the loader) lets the receiver finish its load cleanly; vLLM's layerwise reload in
    particular is left half-initialised by an exception. The caller must then refuse to generate
    until a complete update succeeds. No tensor is referenced after it has been handed on."""

    def __init__(self, named_tensors: Iterable[tuple[str, torch.Tensor]], manifest: dict[str, tuple[int, ...]],
                 expected: dict[str, tuple[int, ...]], aliases: dict[str, str] | None = None):
        self.aliases = TIED_ALIASES if aliases is None else aliases
        self.manifest = check_manifest(manifest, expected, self.aliases)
        self.expected = expected
        self.source = named_tensors
        self.loaded = 0
        self.error: BaseException | None = None

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        seen = set()
        try:
            for item in self.source:
                name, t = unpack(item)
                if name in seen:
                    problem = f"{name}: given twice"
                elif name not in self.manifest:
                    problem = f"{name}: not in the manifest"
                else:  # known names only, so no aliases: the manifest already resolved them
                    problem = tensor_problem(name, t, self.manifest, {})
                if problem:
                    self.fail(problem)
                    return
                seen.add(name)
                if name in self.expected:
                    self.loaded += 1
                    yield name, t
                del item, t
        except Exception as e:  # the producer itself failed (or sent a non-pair): end, report later
            e.add_note(self.partial_note())
            self.error = e
            return
        missing = sorted(set(self.manifest) - seen)
        if missing:
            self.fail(f"stream ended without {len(missing)} manifest weights, e.g. {missing[:3]}")

    def fail(self, problem: str) -> None:
        self.error = ValueError(f"update_weights stream broke its manifest: {problem}. {self.partial_note()}")

    def partial_note(self) -> str:
        return (f"{self.loaded} tensors were already loaded, so the generator holds a partly updated model "
                "and refuses to generate until a complete update_weights succeeds")

    def raise_if_broken(self) -> None:
        if self.error is not None:
            raise self.error


def buckets(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_mb: int, device: torch.device,
            dtype: torch.dtype) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Yield lists of tensors moved to the receiver's device and dtype, about bucket_mb at a time.
    A tensor already there is passed through without a copy. Draws from `named_tensors` lazily."""
    limit = bucket_mb * 2**20
    bucket, size = [], 0
    for name, t in named_tensors:
        bucket.append((name, t.detach().to(device=device, dtype=dtype).contiguous()))
        size += t.numel() * dtype.itemsize
        del t  # the source tensor (e.g. a freshly gathered fp32 one) is not needed once converted
        if size >= limit:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


def stream(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_mb: int, device: torch.device,
           dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """The buckets flattened into one iterator; each bucket is dropped once consumed."""
    for bucket in buckets(named_tensors, bucket_mb, device, dtype):
        yield from bucket
        del bucket


def push_weights(learner, generator, version: int) -> int:
    """Put the learner's weights into the generator as `version`, and return the bytes exported: the one
    path from training to generation (the loop's syncs, a stage's start, the benches). The learner
    yields one gathered tensor at a time; the generator checks the manifest before drawing the first
    and moves them in generator.weight_bucket_mb buckets, so neither side holds a second full copy of
    the model. Every rank must call it: gathering a sharded parameter is a collective.

    A LoRA learner (one with a `base_token`) and a generator that can hold its adapters: the base
    weights go once per learner (they never change under LoRA), then A and B alone. Otherwise the
    learner's merged weights go whole."""
    token = getattr(learner, "base_token", None)
    hold = getattr(generator, "hold_adapters", None)
    if token is None or hold is None or not hold(learner.adapter_config()):
        return export_into(learner, generator, version, "merged")
    exported = 0
    if generator.adapter_base != token:
        exported += export_into(learner, generator, version, "base")
    exported += export_into(learner, generator, version, "adapter")
    generator.adapter_base = token
    return exported


def export_into(learner, generator, version: int, part: str) -> int:
    """One part of the learner's export (Learner.export_weights) streamed into the generator; the bytes.
    The merged part is asked for with no arguments, which any learner and generator take."""
    exported = 0
    which = () if part == "merged" else (part,)

    def named():
        nonlocal exported
        for name, t in learner.export_weights(*which):
            exported += getattr(t, "nbytes", 0)
            yield name, t
            del t  # dropped before the next parameter is gathered

    more = {"part": "adapter"} if part == "adapter" else {}
    generator.update_weights(named(), version, manifest=learner.weight_manifest(*which), **more)
    return exported
