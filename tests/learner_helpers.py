"""What the learner's tests share: a tiny random Llama with a VOCAB-token vocabulary (conftest's `tiny`
fixture builds it once) and batches of random groups over that vocabulary."""
import torch

from memr1.rl.records import Group, TrainBatch

VOCAB = 32


def tiny_learner_model(path) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=128, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


def make_batch(seed=0, groups=4, size=2, behav=True) -> TrainBatch:
    """`groups` prompts of 3..5 tokens, each with `size` responses of different lengths and 0/1 rewards."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(groups):
        prompt = torch.randint(0, VOCAB, (3 + i % 3,), generator=g).tolist()
        responses = [torch.randint(0, VOCAB, (4 + (i * 5 + j * 3) % 6,), generator=g).tolist() for j in range(size)]
        logps = [(-3.5 + 0.1 * torch.randn(len(r), generator=g)).tolist() for r in responses] if behav else None
        rewards = torch.randint(0, 2, (size,), generator=g).float().tolist()
        out.append(Group(prompt, responses, logps, rewards, source=f"g{i}"))
    return TrainBatch(out)
