"""One engine, several checkpoints of one architecture: each role (extraction, manager, answer agent,
judge) gets a view that loads its checkpoint into the shared engine on first use.

Eval and stage-2 bank building run their roles one phase after another, so swapping weights in place
(`update_weights`, ~0.5 s for SmolLM2 on 2 cores) replaces starting one engine per role (~20 s each,
plus its KV cache). The checkpoint streams from disk tensor by tensor against its header manifest, so
no second full copy of the model is ever held.
"""
from pathlib import Path

from safetensors import safe_open

from memr1.engine.generation.weights import checkpoint_manifest


def iter_checkpoint(path: Path):
    """(name, tensor) of every tensor in a safetensors checkpoint folder, read one at a time."""
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            for name in fh.keys():
                yield name, fh.get_tensor(name)


class WeightSwap:
    def __init__(self, generator, loaded: Path | None = None):
        """`loaded`: the checkpoint the engine holds now (None: unknown, the first use loads)."""
        self.generator = generator
        self.loaded = Path(loaded).resolve() if loaded is not None else None
        self.swaps = 0

    def load(self, path: Path) -> None:
        path = Path(path).resolve()
        if path == self.loaded:
            return
        self.generator.update_weights(iter_checkpoint(path), self.generator.weight_version + 1,
                                      manifest=checkpoint_manifest(path))
        self.loaded = path
        self.swaps += 1

    def view(self, path: Path) -> "WeightView":
        return WeightView(self, Path(path))


class WeightView:
    """Quacks like a Generator for `generate`; loads its checkpoint first when another one is in."""

    def __init__(self, swap: WeightSwap, path: Path):
        self.swap, self.path = swap, path

    @property
    def tokenizer(self):
        return self.swap.generator.tokenizer

    def generate(self, prompts, n, sampling):
        self.swap.load(self.path)
        return self.swap.generator.generate(prompts, n, sampling)
