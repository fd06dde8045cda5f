"""A checkpoint's manifest, its verification, the choice of the checkpoint to resume from, and pruning.

`manifest.json`, written last into a checkpoint (before the folder is renamed into place):
    {"format": "memr1-checkpoint", "version": 1, "step": N,
     "files": {"model.safetensors": {"bytes": 270123456, "sha256": "..."}, ...}}
It lists every file of the checkpoint, so a file that is missing, truncated or changed afterwards is
found at load. Verification checks presence and sizes always, every safetensors header against its
file, and the SHA-256 of each file when resuming (a few seconds per GB). A checkpoint written before
manifests existed is accepted when its required files are there and its state.json reads.
`weights_digest` is what `memr1 eval` and `memr1 rollout` call on each model folder before any of
its weights is used: the model files' SHA-256 against the manifest, and the digest of the weights as
read now (the one a rollout manifest records).
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Annotated, Callable

import msgspec
from msgspec import Meta

from memr1.rl.fileio import open_regular, read_regular, safetensors_header

MANIFEST = "manifest.json"
FORMAT = "memr1-checkpoint"
REQUIRED = ("config.json", "model.safetensors", "optimizer.pt", "scheduler.pt", "state.json", "rng_rank0.pt")
# A LoRA run's adapter, in peft's layout in a folder of its own: at the top, transformers would take
# adapter_config.json for a PEFT checkpoint and the loaders' *.safetensors globs would take the adapter
# for model weights. The manifest lists these two by their relative paths.
ADAPTER_DIR = "adapter"
ADAPTER_FILES = (f"{ADAPTER_DIR}/adapter_model.safetensors", f"{ADAPTER_DIR}/adapter_config.json")


class CheckpointConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    # Newest checkpoints kept per stage; older ones are deleted after each save, except the one
    # best.json names and the newest one that verifies. 2 leaves a fallback when the latest is damaged.
    keep_last: Annotated[int, Meta(ge=1, le=10_000)] = 2


class CheckpointError(ValueError):
    """No usable checkpoint where one is needed; the message names the folder and what is wrong."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open_regular(path) as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(folder: str | Path, step: int) -> None:
    """List every file of `folder` (a finished checkpoint, not yet renamed into place)."""
    folder = Path(folder)
    files = {f.name: {"bytes": f.stat().st_size, "sha256": _sha256(f)}
             for f in sorted(folder.iterdir()) if f.is_file() and f.name != MANIFEST}
    files.update({name: {"bytes": (folder / name).stat().st_size, "sha256": _sha256(folder / name)}
                  for name in ADAPTER_FILES if (folder / name).is_file()})
    (folder / MANIFEST).write_text(json.dumps({"format": FORMAT, "version": 1, "step": step, "files": files}))


def step_of(path: Path) -> int | None:
    tail = path.name.split("_", 1)[1] if path.name.startswith("step_") else ""
    return int(tail) if tail.isdigit() else None


def checkpoints(stage_dir) -> list[Path]:
    """A stage's `checkpoints/step_<N>` folders, newest first (unfinished `.tmp` saves are not listed)."""
    found = [(s, p) for p in (Path(stage_dir) / "checkpoints").glob("step_*")
             if (s := step_of(p)) is not None and p.is_dir()]
    return [p for _, p in sorted(found, reverse=True)]


def header_problem(f: Path) -> str | None:
    try:
        safetensors_header(f)
    except (OSError, ValueError) as e:
        return f"{f.name} is not a whole safetensors file ({e})"
    return None


def verify(path: Path, checksums: bool = True, state: bool = True, digests: dict | None = None) -> str | None:
    """What is wrong with the checkpoint at `path`, or None when it is whole. `state=False`: the model
    alone (the training state's *.pt files are neither required nor read); `digests` receives the
    SHA-256 computed of each file checked."""
    path = Path(path)
    if not path.is_dir():
        return "not a folder"
    try:   # never a FIFO or device (read_regular): a planted one would hang the check
        manifest = json.loads(read_regular(path / MANIFEST))
    except FileNotFoundError:
        manifest = None
    except (OSError, ValueError, RecursionError) as e:   # not a file, not JSON, not UTF-8, nested 100,000 deep
        return f"{MANIFEST} does not read ({type(e).__name__})"
    required = [n for n in REQUIRED if state or not n.endswith(".pt")]
    if manifest is None:   # written before manifests: the required files and a readable state.json
        missing = [n for n in required if not (path / n).is_file() or (path / n).stat().st_size == 0]
        if missing:
            return f"missing or empty: {', '.join(missing)}"
        if problem := next(filter(None, map(header_problem, sorted(path.glob("*.safetensors")))), None):
            return problem
    else:
        files = manifest.get("files") if isinstance(manifest, dict) else None
        if (not isinstance(files, dict) or manifest.get("format") != FORMAT
                or not all(isinstance(w, dict) and (Path(n).name == n != ".." or n in ADAPTER_FILES)
                           for n, w in files.items())):
            return f"{MANIFEST} is not a memr1 checkpoint manifest"   # a list, a string, a path outside
        if missing := [n for n in required if n not in files]:
            return f"{MANIFEST} does not list {', '.join(missing)}"
        if extra := sorted(f.name for f in path.glob("*.safetensors") if f.name not in files):
            return f"{extra[0]} is not in {MANIFEST}"   # it would be loaded with the listed weights
        for name, want in files.items():
            f = path / name
            if not state and name.endswith(".pt"):
                continue
            try:
                if not f.is_file():
                    return f"{name} is missing"
                if f.stat().st_size != want.get("bytes"):
                    return f"{name} has {f.stat().st_size} bytes, {want.get('bytes')} were written"
                if checksums:
                    got = _sha256(f)
                    if got != want.get("sha256"):
                        return f"{name} does not match its checksum"
                    if digests is not None:
                        digests[name] = got
                if name.endswith(".safetensors") and (problem := header_problem(f)):
                    return problem
            except OSError as e:   # unreadable, or removed while being read
                return f"{name} does not read ({e})"
    try:
        state = json.loads(read_regular(path / "state.json"))
        int(state["step"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        return f"state.json does not read ({type(e).__name__}: {str(e)[:200]})"
    return None


def weights_digest(path: str | Path, what: str = "checkpoint") -> str:
    """Check a model folder before any weight of it is used, and return its weights' SHA-256 as read
    now: with a memr1 manifest, every model file against its recorded SHA-256 (the training state is
    not loaded, so not read); every *.safetensors header against its file. The digest is over
    {file name: SHA-256} of the *.safetensors files, so two folders with the same weights give the
    same digest, and a manifest cannot vouch for weights other than those read."""
    path = Path(path)
    digests: dict[str, str] = {}
    if (path / MANIFEST).exists() or (path / MANIFEST).is_symlink():
        if (problem := verify(path, checksums=True, state=False, digests=digests)) is not None:
            raise CheckpointError(f"{what} {path}: {problem}")
    weights = sorted(f.name for f in path.glob("*.safetensors"))
    if not weights:
        raise CheckpointError(f"{what} {path}: no *.safetensors weights there")
    for name in weights:
        if name not in digests:
            if (problem := header_problem(path / name)) is not None:
                raise CheckpointError(f"{what} {path}: {problem}")
            try:
                digests[name] = _sha256(path / name)
            except OSError as e:
                raise CheckpointError(f"{what} {path}: {name} does not read ({e})") from None
    return hashlib.sha256(json.dumps({n: digests[n] for n in weights}, sort_keys=True).encode()).hexdigest()


# the files that decide a tokenizer's ids, whichever of them a model folder has
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "added_tokens.json")


def tokenizer_digest(path: str | Path) -> str:
    """SHA-256 over {file name: SHA-256} of a model folder's tokenizer files (what `memr1 rollout`
    records, so shards are never replayed under other token ids)."""
    parts = {name: _sha256(Path(path) / name) for name in TOKENIZER_FILES if (Path(path) / name).is_file()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def best_step(stage_dir) -> int | None:
    """The step best.json names, or None."""
    try:
        return int(json.loads((Path(stage_dir) / "best.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


def usable_checkpoint(stage_dir, say: Callable[[str], None] = print) -> Path | None:
    """The newest checkpoint of a stage that verifies (checksums included), saying which damaged ones
    it passed over. None when the stage has no checkpoint; CheckpointError when none of them verifies."""
    found, bad = checkpoints(stage_dir), []
    for path in found:
        problem = verify(path)
        if problem is None:
            if bad:
                say(f"warning: falling back to {path}: the newer checkpoint(s) are damaged ({'; '.join(bad)})")
            return path
        bad.append(f"{path.name}: {problem}")
    if found:
        raise CheckpointError(f"{stage_dir}: no usable checkpoint to resume from ({'; '.join(bad)})")
    return None


def newest_whole(stage_dir) -> Path | None:
    """The newest checkpoint whose files are all there (sizes only: cheap enough to call often)."""
    return next((p for p in checkpoints(stage_dir) if verify(p, checksums=False) is None), None)


def prune(stage_dir, keep_last: int, current: int | None = None) -> list[Path]:
    """Delete all but the newest `keep_last` checkpoints of a stage, never the one best.json names nor
    the newest one that verifies (when the newest ones are damaged). Checkpoints past `current` (the
    step just saved) are the damaged ones a resume fell back from: deleted too. Returns what went."""
    found, best = checkpoints(stage_dir), best_step(stage_dir)
    passed = [p for p in found if current is not None and step_of(p) > current]
    found = [p for p in found if p not in passed]
    keep = set(found[:keep_last]) | {p for p in found if step_of(p) == best}
    whole = next((p for p in found if verify(p, checksums=False) is None), None)
    keep |= {whole} if whole is not None else set()
    gone = passed + [p for p in found if p not in keep]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone
