"""The tiny random Llama the tests share (SmolLM2's tokenizer, 2 layers, sharpened weights)."""
from memr1.bench.common import tiny_llama  # noqa: F401
