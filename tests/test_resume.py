"""Checkpoint/resume: 3 steps + save + fresh learner + 3 steps == 6 uninterrupted; atomic saves."""
import os

import pytest
import torch

from memr1.engine import checkpoint
from memr1.engine.learner import Learner, LearnerConfig
from memr1.rl.losses import LossConfig

from test_learner import make_batch, tiny  # noqa: F401  (fixture reused)


def config(path):
    # warmup makes the LR schedule part of the state that must come back; the KL term makes the loss
    # value depend on the weights (the surrogate alone has ratio 1 in an on-policy step).
    return LearnerConfig(model_path=path, lr=1e-3, warmup_steps=4, weight_decay=0.01,
                         loss=LossConfig(kl_coef=0.5))


def run(learner, steps):
    out = []
    for s in steps:
        metrics = learner.train_step(make_batch(seed=s))
        out.append((metrics["loss"], metrics["lr"], torch.rand(1).item()))  # torch RNG must resume too
    return out


def weights(learner):
    return {k: v.clone() for bucket in learner.export_weights() for k, v in bucket}


def test_resume_equals_uninterrupted(tiny, tmp_path):  # noqa: F811
    uninterrupted = Learner(config(tiny))
    straight = run(uninterrupted, range(6))

    first = Learner(config(tiny))
    head = run(first, range(3))
    path = first.save_checkpoint(str(tmp_path), {"cursor": 3, "epoch": 0})
    assert os.path.basename(path) == "step_3"
    assert sorted(os.listdir(path)) == ["config.json", "model.safetensors", "optimizer.pt", "rng_rank0.pt",
                                       "scheduler.pt", "state.json"]
    torch.manual_seed(12345)  # disturb every stream the checkpoint is supposed to restore
    fresh = Learner(config(tiny))
    assert fresh.load_checkpoint(path) == {"cursor": 3, "epoch": 0}
    assert fresh.step == 3 and fresh.version == 3
    tail = run(fresh, range(3, 6))
    for (a_loss, a_lr, a_rng), (b_loss, b_lr, b_rng) in zip(straight, head + tail):
        assert a_loss == pytest.approx(b_loss, abs=1e-6)
        assert a_lr == b_lr and a_rng == b_rng
    assert straight[-1][0] != straight[1][0]
    w_straight, w_resumed = weights(uninterrupted), weights(fresh)
    assert max((w_straight[k] - w_resumed[k]).abs().max().item() for k in w_straight) < 1e-6


def test_kill_mid_save_keeps_previous_checkpoint(tiny, tmp_path, monkeypatch):  # noqa: F811
    learner = Learner(config(tiny))
    run(learner, range(1))
    good = learner.save_checkpoint(str(tmp_path))
    run(learner, range(1, 2))

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed while writing")
    monkeypatch.setattr(checkpoint, "save_file", killed)
    with pytest.raises(KeyboardInterrupt):
        learner.save_checkpoint(str(tmp_path))
    names = sorted(os.listdir(tmp_path / "checkpoints"))
    assert names == ["step_1", "step_2.tmp"]  # no half-written step_2
    monkeypatch.undo()
    Learner(config(tiny)).load_checkpoint(good)  # the previous one is intact
    assert os.path.isdir(learner.save_checkpoint(str(tmp_path)))  # a retry replaces the debris


def test_checkpoint_from_another_model_is_rejected(tiny, tmp_path):  # noqa: F811
    from transformers import LlamaConfig, LlamaForCausalLM
    other = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                        num_key_value_heads=1, vocab_size=32, tie_word_embeddings=True)
    other_path = tmp_path / "other"
    LlamaForCausalLM(other).save_pretrained(other_path)
    learner = Learner(LearnerConfig(model_path=str(other_path)))
    ckpt = learner.save_checkpoint(str(tmp_path))
    with pytest.raises(ValueError, match="different model: hidden_size"):
        Learner(config(tiny)).load_checkpoint(ckpt)
    with pytest.raises(ValueError, match="no config.json"):
        Learner(config(tiny)).load_checkpoint(str(tmp_path))
