"""Where a run's extractions and banks are cached, keyed by what decides their content.

`memr1 eval` and `memr1 train`'s items both read these caches, so the keys live here and neither
command imports the other. A folder is named by a hash of everything that shapes what it holds (the
weights' identity, the extraction and manager settings, the embedder, the turn limit), so a rerun or
an interrupted run reuses it, and training items reuse an eval's extraction.
"""
import hashlib
import json
import os
from pathlib import Path

import msgspec

from memr1.engine.config.run import RunConfig
from memr1.memory_store.schema import VERSION as BANK_FORMAT
from memr1.rl.task.agents.extract import PROMPT_ID


def model_identity(path: Path) -> str:
    """Names the weights, not the folder: the converted default carries the GGUF digest, any other
    checkpoint is named by its path and its weight files' sizes and mtimes."""
    marker = path / "source.sha256"
    if marker.is_file():
        return f"{path.name}@{marker.read_text().split()[0][:16]}"
    files = sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin"))
    stamp = [(f.name, f.stat().st_size, int(f.stat().st_mtime)) for f in files]
    return f"{path.resolve()}@{_digest(stamp)}"


def cache_keys(cfg: RunConfig, ids: dict[str, str], max_turns: int = 0) -> tuple[str, str]:
    """(extraction key, bank key). Each holds only what changes that content, so the trained eval of a
    run reuses the base eval's extraction (both extract with the base model), and training items and
    stage-2 banks are rebuilt only when something that shapes them changed."""
    common = {"embedder": cfg.embedder, "hash_dim": cfg.bank.hash_dim if cfg.embedder == "hash" else None,
              "dtype": cfg.generator.dtype, "backend": cfg.generator.backend, "max_turns": max_turns}
    facts_key = _digest({**common, "model": ids["extract"], "extract": msgspec.to_builtins(cfg.extract),
                         "prompt": PROMPT_ID})
    # "bank": what a built bank records (2: memories carry their source turns); "format": the bank's file
    # format, which a newer memory_store refuses to open, so such a cache is rebuilt, not failed on
    bank_key = _digest({"facts": facts_key, "model": ids["manager"], "manager": msgspec.to_builtins(cfg.manager),
                        "bank": 2, "format": BANK_FORMAT})
    return facts_key, bank_key


def cache_root(cfg: RunConfig) -> Path:
    """cache_dir, else $MEMR1_CACHE/eval, else the run's own cache folder."""
    return Path(cfg.cache_dir) if cfg.cache_dir else (
        Path(os.environ["MEMR1_CACHE"]) / "eval" if os.environ.get("MEMR1_CACHE") else cfg.resolved_run_dir() / "cache")


def cache_dirs(cfg: RunConfig, ids: dict[str, str], max_turns: int = 0) -> tuple[Path, Path]:
    """(extraction cache, bank cache) folders, under `cache_root`."""
    facts_key, bank_key = cache_keys(cfg, ids, max_turns)
    root = cache_root(cfg)
    return root / "facts" / facts_key, root / "banks" / bank_key


def _digest(key) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
