"""engine.learner on a tiny random Llama: log-probs, micro-batching, packing, bad input, weight export."""
import pytest
import torch

from memr1.engine.learner import Learner, LearnerConfig, TrainBatch
from memr1.rl.algos import PPOConfig
from memr1.rl.losses import LossConfig

VOCAB = 32


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=128, tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("tiny")
    LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


def make_batch(seed=0, n=8, groups=2):
    g = torch.Generator().manual_seed(seed)
    ids, masks, behav = [], [], []
    for i in range(n):
        length, prompt = 9 + (i * 5) % 7, 3 + i % 3
        ids.append(torch.randint(0, VOCAB, (length,), generator=g))
        m = torch.zeros(length, dtype=torch.bool)
        m[prompt:] = True
        masks.append(m)
        behav.append(-3.5 + 0.1 * torch.randn(length, generator=g))
    rewards = torch.randint(0, 2, (n,), generator=g).float()
    return TrainBatch(ids, masks, behav, rewards=rewards, group_ids=torch.arange(n) % groups)


def make_group_batch(seed=0, prompts=2, group=4):
    """GRPO-shaped: each prompt followed by `group` completions of different lengths."""
    g = torch.Generator().manual_seed(seed)
    ids, masks = [], []
    for _ in range(prompts):
        prompt = torch.randint(0, VOCAB, (6,), generator=g)
        for j in range(group):
            ids.append(torch.cat([prompt, torch.randint(0, VOCAB, (3 + 2 * j,), generator=g)]))
            masks.append(torch.arange(len(ids[-1])) >= 6)
    rewards = torch.randint(0, 2, (len(ids),), generator=g).float()
    return TrainBatch(ids, masks, rewards=rewards, group_ids=torch.arange(len(ids)) // group)


def weights(learner):
    return {k: v.clone() for bucket in learner.export_weights() for k, v in bucket}


def test_logprobs_match_full_logits(tiny):
    from memr1.engine.batching import build_micro
    from transformers import AutoModelForCausalLM
    learner = Learner(LearnerConfig(model_path=tiny, temperature=0.7))
    batch = make_batch()
    micro = build_micro(batch, [0, 1, 2], True, False, 64, torch.device("cpu"))
    with torch.no_grad():
        got = learner.policy(micro)
        lm = AutoModelForCausalLM.from_pretrained(tiny)
        want = []
        for i in range(3):
            x, m = batch.input_ids[i], batch.response_mask[i]
            lp = torch.log_softmax(lm(x[None]).logits[0] / 0.7, -1)
            t = torch.nonzero(m).squeeze(1)
            want.append(lp[t - 1, x[t]])
    assert torch.allclose(got, torch.cat(want), atol=1e-5)


def test_shared_prefix_rows_equal_separate_sequences(tiny):
    from memr1.engine.batching import build_micro, prefix_groups
    learner = Learner(LearnerConfig(model_path=tiny))
    batch = make_group_batch()
    seqs = list(range(8))
    assert prefix_groups(batch, seqs, True) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    shared = build_micro(batch, seqs, False, True, 8, torch.device("cpu"))
    assert shared.input_ids.shape == (2, 32)  # 6 + 3 + 5 + 7 + 9 = 30 tokens per row, not 4 x 6 more
    with torch.no_grad():
        got = learner.policy(shared)
        want = learner.policy(build_micro(batch, seqs, True, False, 8, torch.device("cpu")))
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("variant", [{"micro_batch_tokens": 30}, {"layout": "packed"},
                                     {"layout": "rows", "share_prefix": False, "pad_bucket": 8}])
def test_micro_batches_and_padding_equal_one_full_batch(tiny, variant):
    # Adam's first step moves every weight by about lr whatever its gradient's size, so float noise in a
    # near-zero gradient can move a weight by up to lr as well: a small lr keeps that visible but bounded.
    base = dict(model_path=tiny, lr=1e-5, loss=LossConfig(aggregation="seq-mean-token-mean"))
    full = Learner(LearnerConfig(**base, micro_batch_tokens=10_000))
    split = Learner(LearnerConfig(**base, **variant))
    batch = make_batch()
    if "micro_batch_tokens" in variant:
        from memr1.engine.batching import split_parts
        assert len(split_parts(batch, 8, 0, 1, 30, False, True)) == 4
    m_full, m_split = full.train_step(batch), split.train_step(batch)
    assert m_full["loss"] == pytest.approx(m_split["loss"], abs=1e-6)
    w_full, w_split = weights(full), weights(split)
    assert max((w_full[k] - w_split[k]).abs().max().item() for k in w_full) < 1e-6
    assert max((w_full[k] - Learner(LearnerConfig(**base)).policy.lm.state_dict()[k]).abs().max().item()
               for k in w_full) > 5e-6  # the step really moved the weights


def test_ppo_step_fits_the_critic(tiny):
    learner = Learner(LearnerConfig(model_path=tiny, algo="ppo", lr=1e-5, ppo=PPOConfig(critic_lr=1e-3)))
    batch = make_batch()
    losses = [learner.train_step(batch)["value_loss"] for _ in range(6)]
    assert all(v == v for v in losses) and losses[-1] < 0.7 * losses[0]


def test_ppo_with_kl_in_the_reward(tiny):
    cfg = LearnerConfig(model_path=tiny, algo="ppo", lr=1e-2, loss=LossConfig(kl_coef=0.5, kl_in_reward=True))
    learner = Learner(cfg)
    first = learner.train_step(make_batch())
    second = learner.train_step(make_batch())
    assert first["kl"] == 0.0 and second["kl"] == 0.0  # the KL went into the reward, not the loss
    assert all(v == v for v in (*first.values(), *second.values()))
    with pytest.raises(ValueError, match="kl_in_reward"):
        Learner(LearnerConfig(model_path=tiny, loss=LossConfig(kl_coef=0.5, kl_in_reward=True)))


def test_kl_reference_loaded_only_with_nonzero_coefficient(tiny):
    assert Learner(LearnerConfig(model_path=tiny)).ref is None
    learner = Learner(LearnerConfig(model_path=tiny, lr=1e-2, loss=LossConfig(kl_coef=0.1)))
    assert learner.ref is not None
    learner.train_step(make_batch())
    assert learner.train_step(make_batch(1))["kl"] > 0  # the policy moved away from the reference


def test_bad_input_is_a_clear_error(tiny):
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            Learner(LearnerConfig(model_path=tiny, device="cuda"))
    learner = Learner(LearnerConfig(model_path=tiny))
    with pytest.raises(ValueError, match="empty"):
        learner.train_step(TrainBatch([], []))
    batch = make_batch()
    batch.rewards = None
    with pytest.raises(ValueError, match="rewards"):
        learner.train_step(batch)
    batch = make_batch()
    batch.response_mask[0][0] = True
    with pytest.raises(ValueError, match="sequence 0"):
        learner.train_step(batch)
    batch = make_batch()
    batch.input_ids[3][2] = VOCAB
    with pytest.raises(ValueError, match="token ids"):
        learner.train_step(batch)
    batch = make_batch()
    batch.rewards[1] = float("nan")
    with pytest.raises(ValueError):
        learner.train_step(batch)


def test_all_zero_advantages_is_a_clean_no_op(tiny):
    learner = Learner(LearnerConfig(model_path=tiny, lr=1e-2))
    before = weights(learner)
    batch = make_batch()
    batch.rewards = torch.ones(8)  # every group all-equal: zero advantages
    metrics = learner.train_step(batch)
    assert metrics["loss"] == 0.0 and metrics["grad_norm"] == 0.0 and metrics["weight_version"] == 1
    after = weights(learner)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_export_weights_buckets_with_hf_names(tiny):
    from safetensors.torch import load_file
    learner = Learner(LearnerConfig(model_path=tiny))
    buckets = list(learner.export_weights(bucket_bytes=40_000))
    assert len(buckets) > 2
    for b in buckets[:-1]:  # a bucket closes as soon as it reaches the limit
        assert sum(t.numel() * 4 for _, t in b[:-1]) < 40_000
    exported = {k: v for b in buckets for k, v in b}
    on_disk = load_file(f"{tiny}/model.safetensors")
    assert set(exported) == set(on_disk)  # tied lm_head appears once, as HF saves it
    assert all(torch.equal(exported[k], on_disk[k]) for k in on_disk)
    # The manifest names exactly what the export yields, in the same order, without exporting.
    assert list(learner.weight_manifest().items()) == [(k, tuple(v.shape)) for k, v in exported.items()]


def test_activation_checkpointing_changes_memory_not_the_step(tiny):
    # Recomputing each block in backward must give the same loss and the same updated weights.
    outs = {}
    for ac in (False, True):
        learner = Learner(LearnerConfig(model_path=tiny, lr=1e-2, activation_checkpointing=ac))
        assert learner.policy.lm.model.gradient_checkpointing is ac
        m = learner.train_step(make_group_batch())
        outs[ac] = (m["loss"], weights(learner))
    assert outs[True][0] == pytest.approx(outs[False][0], abs=1e-6)
    for name, w in outs[False][1].items():
        torch.testing.assert_close(outs[True][1][name], w, atol=1e-6, rtol=0)
