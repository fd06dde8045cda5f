"""A tiny random Llama with SmolLM2's tokenizer, for tests where a real model adds nothing."""
import shutil

import torch

from memr1.engine.generation import default_model_path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def tiny_llama(folder, layers: int = 2, hidden: int = 64, scale: float = 8.0):
    """Saved as an ordinary HF checkpoint. Weights are scaled up so distributions are far from uniform."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale if p.dim() > 1 else 1.0)
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(default_model_path() / name, folder / name)
    return folder
