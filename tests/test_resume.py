"""Checkpoint/resume: 3 steps + save + fresh learner + 3 steps == 6 uninterrupted; atomic saves."""
import os
import pickle
import random

import numpy as np
import pytest
import torch

from memr1.engine.checkpoints import io as checkpoint
from memr1.engine.training.config import LearnerConfig
from memr1.engine.training.learner import Learner
from memr1.rl.algos.config import LossConfig

from learner_helpers import make_batch


def config(path):
    # warmup makes the LR schedule part of the state that must come back; the KL term makes the loss
    # value depend on the weights (the surrogate alone has ratio 1 in an on-policy step).
    return Learner(LearnerConfig(warmup_steps=4, weight_decay=0.01, loss=LossConfig(kl_coef=0.5)), path, lr=1e-3)


def run(learner, steps):
    out = []
    for s in steps:
        metrics = learner.train_step(make_batch(seed=s))
        # torch, python and numpy RNGs must resume too
        out.append((metrics["loss"], metrics["lr"], torch.rand(1).item(), random.random(), float(np.random.rand())))
    return out


def weights(learner):
    return {k: v.clone() for k, v in learner.export_weights()}


def test_resume_equals_uninterrupted(tiny, tmp_path):  # noqa: F811
    uninterrupted = config(tiny)
    straight = run(uninterrupted, range(6))

    first = config(tiny)
    head = run(first, range(3))
    path = checkpoint.save(first, str(tmp_path), 3, {"cursor": 3, "epoch": 0})
    assert os.path.basename(path) == "step_3"
    assert sorted(os.listdir(path)) == ["config.json", "manifest.json", "model.safetensors", "optimizer.pt",
                                       "rng_rank0.pt", "scheduler.pt", "state.json"]
    torch.manual_seed(12345)  # disturb every stream the checkpoint is supposed to restore
    random.seed(7)
    np.random.seed(7)
    fresh = config(tiny)
    assert checkpoint.load(fresh, path)["data"] == {"cursor": 3, "epoch": 0}
    assert fresh.step == 3 and fresh.version == 3
    tail = run(fresh, range(3, 6))
    for (a_loss, a_lr, *a_rng), (b_loss, b_lr, *b_rng) in zip(straight, head + tail):
        assert a_loss == pytest.approx(b_loss, abs=1e-6)
        assert a_lr == b_lr and a_rng == b_rng
    assert straight[-1][0] != straight[1][0]
    w_straight, w_resumed = weights(uninterrupted), weights(fresh)
    assert max((w_straight[k] - w_resumed[k]).abs().max().item() for k in w_straight) < 1e-6


def test_kill_mid_save_keeps_previous_checkpoint(tiny, tmp_path, monkeypatch):  # noqa: F811
    learner = config(tiny)
    run(learner, range(1))
    good = checkpoint.save(learner, str(tmp_path), 1)
    run(learner, range(1, 2))

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed while writing")
    monkeypatch.setattr(checkpoint, "save_file", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(learner, str(tmp_path), 2)
    names = sorted(os.listdir(tmp_path / "checkpoints"))
    assert names == ["step_1", "step_2.tmp"]  # no half-written step_2
    monkeypatch.undo()
    checkpoint.load(config(tiny), good)  # the previous one is intact
    assert os.path.isdir(checkpoint.save(learner, str(tmp_path), 2))  # a retry replaces the debris


def test_checkpoint_from_another_model_is_rejected(tiny, tmp_path):  # noqa: F811
    from transformers import LlamaConfig, LlamaForCausalLM
    other = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                        num_key_value_heads=1, vocab_size=32, tie_word_embeddings=True)
    other_path = tmp_path / "other"
    LlamaForCausalLM(other).save_pretrained(other_path)
    learner = Learner(LearnerConfig(), str(other_path), lr=1e-3)
    ckpt = checkpoint.save(learner, str(tmp_path), 0)
    with pytest.raises(ValueError, match="different model: hidden_size"):
        checkpoint.load(config(tiny), ckpt)
    with pytest.raises(ValueError, match="no config.json"):
        checkpoint.load(config(tiny), str(tmp_path))


def test_a_checkpoint_is_a_self_contained_model_folder(tmp_path):
    """Tokenizer, chat template and generation config travel with the weights: transformers loads model
    and tokenizer from the checkpoint alone, and generates."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from tiny_model import tiny_llama
    model = tiny_llama(tmp_path / "model")
    learner = Learner(LearnerConfig(), str(model), lr=1e-3)
    path = checkpoint.save(learner, str(tmp_path / "run"), 5, {"step": 5}, model_dir=str(model))
    tok = AutoTokenizer.from_pretrained(path)
    lm = AutoModelForCausalLM.from_pretrained(path)
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    out = lm.generate(ids, max_new_tokens=3, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 3 and (tmp_path / "run/checkpoints/step_5/generation_config.json").is_file()


class Boom:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


@pytest.mark.parametrize("name", ["rng_rank0.pt", "optimizer.pt", "scheduler.pt"])
def test_a_crafted_checkpoint_cannot_run_code(tiny, tmp_path, name, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    learner = config(tiny)
    run(learner, range(1))
    path = checkpoint.save(learner, str(tmp_path), 1)
    with open(os.path.join(path, name), "wb") as f:
        pickle.dump({"state": Boom()}, f)
    with pytest.raises(pickle.UnpicklingError):
        checkpoint.load(config(tiny), path)
    assert not (tmp_path / "pwned").exists()
