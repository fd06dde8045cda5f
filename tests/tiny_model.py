"""The tiny random Llama the tests share (SmolLM2's tokenizer, 2 layers, sharpened weights)."""
from memr1.bench.common import random_llama


def tiny_llama(folder, layers: int = 2, hidden: int = 64, scale: float = 8.0):
    return random_llama(folder, layers=layers, hidden=hidden, heads=4, kv_heads=2, ffn_mult=2, scale=scale,
                        max_positions=2048)
