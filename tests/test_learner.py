"""engine.training.learner on a tiny random Llama: log-probs, micro-batching, prompt sharing, packing, the
warm start's scripted replies, bad input, weight export."""
import math

import pytest
import torch

from memr1.engine.training.batching import build_micro, micro_count, split_units, units_of
from memr1.engine.training.config import LearnerConfig
from memr1.engine.training.learner import Learner
from memr1.rl.algos.config import LossConfig, PPOConfig
from memr1.rl.records import TARGET, Group, TrainBatch
from learner_helpers import VOCAB, make_batch

def learner_for(tiny, **kw) -> Learner:
    lr, temperature = kw.pop("lr", 1e-5), kw.pop("temperature", 1.0)
    return Learner(LearnerConfig(**kw), tiny, lr=lr, temperature=temperature)


def weights(learner):
    return {k: v.clone() for k, v in learner.export_weights()}


@pytest.mark.parametrize("layout,share", [("packed", False), ("rows", False), ("rows", True)])
def test_logprobs_match_full_logits(tiny, layout, share):
    from transformers import AutoModelForCausalLM
    learner = learner_for(tiny, temperature=0.7, layout=layout)
    batch = make_batch()
    units = units_of(batch, share=share)[:2 if share else 3]
    micro = build_micro(units, layout == "packed", 8, torch.device("cpu"))
    n = sum(map(len, units))
    with torch.no_grad():
        got = learner.policy(micro)
        lm = AutoModelForCausalLM.from_pretrained(tiny)
        want = []
        for g in batch.groups[:2]:
            for r in g.responses:
                x = torch.tensor(g.prompt_ids + r)
                lp = torch.log_softmax(lm(x[None]).logits[0] / 0.7, -1)
                t = torch.arange(len(g.prompt_ids), len(x))
                want.append(lp[t - 1, x[t]])
    assert torch.allclose(got, torch.cat(want[:n]), atol=1e-5)


def test_a_rows_layout_model_called_without_a_layout_is_plain_sdpa(tiny):
    from transformers import AutoModelForCausalLM
    learner = learner_for(tiny, layout="rows")
    sdpa = AutoModelForCausalLM.from_pretrained(tiny, attn_implementation="sdpa")
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    with torch.no_grad():
        got, want = (m(ids, attention_mask=mask).logits for m in (learner.policy.lm, sdpa))
    assert torch.allclose(got[mask.bool()], want[mask.bool()], atol=1e-5)


def test_a_group_shares_its_prompt_in_one_row(tiny):
    learner = learner_for(tiny)
    batch = make_batch(groups=2, size=4)
    shared, separate = units_of(batch, share=True), units_of(batch, share=False)
    assert [len(u) for u in shared] == [4, 4] and len(separate) == 8
    micro = build_micro(shared, False, 8, torch.device("cpu"))
    p = len(batch.groups[0].prompt_ids)
    assert micro.input_ids.shape[0] == 2 and (micro.input_ids[0] != 0).sum() <= p + batch.groups[0].response_tokens
    with torch.no_grad():
        got = learner.policy(micro)
        want = learner_for(tiny, layout="packed").policy(build_micro(separate, True, 8, torch.device("cpu")))
    assert torch.allclose(got, want, atol=1e-5)
    # what the learner is charged for is what a packed micro-batch of the shared units really holds
    assert batch.positions == build_micro(shared, True, 1, torch.device("cpu")).input_ids.shape[1]


@pytest.mark.parametrize("variant", [{"micro_batch_tokens": 20}, {"layout": "packed"},
                                     {"layout": "rows", "share_prefix": False, "pad_bucket": 8}])
def test_micro_batches_and_padding_equal_one_full_batch(tiny, variant):
    # Adam's first step moves every weight by about lr whatever its gradient's size, so float noise in a
    # near-zero gradient can move a weight by up to lr as well: a small lr keeps that visible but bounded.
    base = dict(loss=LossConfig(aggregation="seq-mean-token-mean"))
    full = learner_for(tiny, **base, micro_batch_tokens=10_000)
    split = learner_for(tiny, **base, **variant)
    batch = make_batch()
    if "micro_batch_tokens" in variant:
        units = units_of(batch, share=True)
        assert micro_count(units, 20) == 4 and sum(map(len, split_units(units, 4))) == 4
    m_full, m_split = full.train_step(batch), split.train_step(batch)
    assert m_full["loss"] == pytest.approx(m_split["loss"], abs=1e-6)
    w_full, w_split = weights(full), weights(split)
    assert max((w_full[k] - w_split[k]).abs().max().item() for k in w_full) < 1e-6
    assert max((w_full[k] - learner_for(tiny).policy.lm.state_dict()[k]).abs().max().item()
               for k in w_full) > 5e-6  # the step really moved the weights


def test_scripted_replies_train_their_negative_log_likelihood(tiny):
    """A warm-start group (advantage 1, no behaviour log-probs): the step lowers the replies' NLL."""
    learner = learner_for(tiny, lr=3e-2)
    batch = make_batch(groups=3, size=1, behav=False)
    for g in batch.groups:
        g.credit = [TARGET]
    nll = [learner.train_step(batch)["nll"] for _ in range(5)]
    assert nll[-1] < 0.7 * nll[0]


def test_ppo_step_fits_the_critic(tiny):
    learner = learner_for(tiny, algo="ppo", lr=1e-5, ppo=PPOConfig(critic_lr=1e-3))
    batch = make_batch()
    losses = [learner.train_step(batch)["value_loss"] for _ in range(6)]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < 0.7 * losses[0]


def test_ppo_with_kl_in_the_reward(tiny):
    learner = learner_for(tiny, algo="ppo", lr=1e-2, loss=LossConfig(kl_coef=0.5, kl_in_reward=True))
    first = learner.train_step(make_batch())
    second = learner.train_step(make_batch())
    assert first["kl"] == 0.0 and second["kl"] == 0.0  # the KL went into the reward, not the loss
    assert all(math.isfinite(v) for v in (*first.values(), *second.values()) if isinstance(v, (int, float)))
    with pytest.raises(ValueError, match="kl_in_reward"):
        learner_for(tiny, loss=LossConfig(kl_coef=0.5, kl_in_reward=True))


def test_kl_reference_loaded_only_with_nonzero_coefficient(tiny):
    assert learner_for(tiny).ref is None
    learner = learner_for(tiny, lr=1e-2, loss=LossConfig(kl_coef=0.1))
    assert learner.ref is not None
    learner.train_step(make_batch())
    assert learner.train_step(make_batch(1))["kl"] > 0  # the policy moved away from the reference


def test_bad_input_is_a_clear_error(tiny):
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            learner_for(tiny, device="cuda")
    with pytest.raises(ValueError, match="attn_impl='eager' needs learner.layout='packed'"):
        learner_for(tiny, layout="rows", attn_impl="eager")
    learner = learner_for(tiny)
    with pytest.raises(ValueError, match="empty"):
        learner.train_step(TrainBatch([]))
    with pytest.raises(ValueError, match="rewards"):
        Group([1, 2], [[3], [4]], None, [1.0])
    with pytest.raises(ValueError, match="prompt has no tokens"):
        Group([], [[3]], None, [1.0])
    with pytest.raises(ValueError, match="behav_logprobs"):
        Group([1], [[3, 4]], [[-1.0]], [1.0])
    batch = make_batch()
    batch.groups[1].responses[0][2] = VOCAB
    with pytest.raises(ValueError, match="token ids"):
        learner.train_step(batch)
    batch = make_batch()
    batch.groups[0].rewards[1] = float("nan")
    with pytest.raises(ValueError):
        learner.train_step(batch)


def test_all_zero_advantages_is_a_clean_no_op(tiny):
    learner = learner_for(tiny, lr=1e-2)
    before = weights(learner)
    batch = make_batch()
    for g in batch.groups:
        g.rewards = [1.0] * len(g)  # every group all-equal: zero advantages
    metrics = learner.train_step(batch)
    assert metrics["loss"] == 0.0 and metrics["grad_norm"] == 0.0 and metrics["weight_version"] == 1
    after = weights(learner)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_export_weights_yields_pairs_with_hf_names(tiny):
    from safetensors.torch import load_file
    learner = learner_for(tiny)
    pairs = list(learner.export_weights())
    assert all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in pairs)  # pairs, not buckets
    exported = dict(pairs)
    assert len(exported) == len(pairs)
    on_disk = load_file(f"{tiny}/model.safetensors")
    assert set(exported) == set(on_disk)  # tied lm_head appears once, as HF saves it
    assert all(torch.equal(exported[k], on_disk[k]) for k in on_disk)
    # The manifest names exactly what the export yields, in the same order, without exporting.
    assert list(learner.weight_manifest().items()) == [(k, tuple(v.shape)) for k, v in exported.items()]


def test_activation_checkpointing_changes_memory_not_the_step(tiny):
    # Recomputing each block in backward must give the same loss and the same updated weights.
    outs = {}
    for ac in (False, True):
        learner = learner_for(tiny, lr=1e-2, activation_checkpointing=ac)
        assert learner.policy.lm.model.gradient_checkpointing is ac
        m = learner.train_step(make_batch(groups=2, size=4))
        outs[ac] = (m["loss"], weights(learner))
    assert outs[True][0] == pytest.approx(outs[False][0], abs=1e-6)
    for name, w in outs[False][1].items():
        torch.testing.assert_close(outs[True][1][name], w, atol=1e-6, rtol=0)


def test_cpu_bf16_autocast_is_the_fp32_step_to_bf16_precision(tiny):
    """cpu_precision bf16: the forward runs in bf16 (log-probs differ from fp32 by bf16 rounding, not
    by more), master weights and their update stay fp32."""
    outs = {}
    for precision in ("fp32", "bf16"):
        learner = learner_for(tiny, lr=1e-3, cpu_precision=precision)
        assert learner.cpu_bf16 is (precision == "bf16")
        m = learner.train_step(make_batch(groups=2, size=4))
        outs[precision] = (m["loss"], m["nll"], weights(learner))
    assert outs["bf16"][1] != outs["fp32"][1]                       # bf16 matmuls really ran
    assert outs["bf16"][1] == pytest.approx(outs["fp32"][1], rel=2e-2)
    for name, w in outs["fp32"][2].items():
        assert outs["bf16"][2][name].dtype == torch.float32
        torch.testing.assert_close(outs["bf16"][2][name], w, atol=3e-3, rtol=0)


def test_train_layers_freezes_all_but_the_top_blocks(tiny):
    learner = learner_for(tiny, lr=1e-2, train_layers=1)
    before = weights(learner)
    m = learner.train_step(make_batch())
    after = weights(learner)
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(k.startswith(("model.layers.1.", "model.norm.")) for k in moved), sorted(moved)
    assert any(k.startswith("model.layers.1.") for k in moved) and m["grad_norm"] > 0
    with pytest.raises(ValueError, match="train_layers=3"):
        learner_for(tiny, train_layers=3)


def test_groups_with_zero_advantages_are_skipped_without_changing_the_step(tiny):
    """All-equal rewards give a group zero advantages: the learner does not compute it, and the step
    (loss, weights) equals the one that computes every group (skip_zero_advantage off)."""
    batch = make_batch(groups=4, size=4)
    batch.groups[1].rewards = [1.0] * 4
    batch.groups[3].rewards = [0.0] * 4
    skip = learner_for(tiny, lr=1e-3)
    m_skip = skip.train_step(batch)
    full = learner_for(tiny, lr=1e-3, skip_zero_advantage=False)
    m_full = full.train_step(batch)
    assert m_skip["computed_frac"] < 1.0 == m_full["computed_frac"]
    assert m_skip["signal_frac"] == m_full["signal_frac"] == m_skip["computed_frac"]
    assert m_skip["positions"] < m_full["positions"]
    assert m_skip["loss"] == pytest.approx(m_full["loss"], abs=1e-7)
    assert m_skip["grad_norm"] == pytest.approx(m_full["grad_norm"], rel=1e-5)
    # Adam's first step moves a weight by lr * g / (|g| + eps): sign-like, except for the few weights
    # whose gradient is near eps, where the float32 sums of two batch shapes (the skipped rows change
    # the matmul sizes) may differ in their last digits. Those move by a small fraction of lr; a
    # group wrongly skipped moves thousands of weights by about lr.
    w_skip, w_full = weights(skip), weights(full)
    diff = torch.cat([(w_skip[k] - w_full[k]).abs().flatten() for k in w_full])
    assert diff.max().item() < 0.02 * 1e-3 and (diff > 1e-6).sum().item() <= 16, (diff.max(), (diff > 1e-6).sum())


def same(a, b) -> bool:
    """Equal nested state: dicts, lists, tensors (exactly) and plain values."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_state_dict_round_trips_into_a_fresh_learner(tiny, algo):
    """A fresh learner given another's state_dict holds the same weights, optimizer and schedule state
    and counters, and takes the same next step (warmup makes the schedule part of that state)."""
    kw = dict(algo=algo, lr=1e-3, warmup_steps=4, ppo=PPOConfig(critic_lr=1e-3))
    trained = learner_for(tiny, **kw)
    for s in range(2):
        trained.train_step(make_batch(seed=s))
    fresh = learner_for(tiny, **kw)
    fresh.load_state_dict(trained.state_dict())
    assert (fresh.step, fresh.version) == (trained.step, trained.version) == (2, 2)
    models = [("policy", "optim", "sched")] + ([("critic", "critic_optim", "critic_sched")] if algo == "ppo" else [])
    for names in models:
        for name in names:
            assert same(getattr(fresh, name).state_dict(), getattr(trained, name).state_dict()), name
    a, b = trained.train_step(make_batch(seed=2)), fresh.train_step(make_batch(seed=2))
    assert a["loss"] == b["loss"] and a["lr"] == b["lr"] and a["grad_norm"] == b["grad_norm"]
    assert same(fresh.policy.state_dict(), trained.policy.state_dict())


def test_a_hints_tokens_train_as_if_the_learner_had_sampled_them(tiny):
    """NaN behaviour log-probs (rl/task/hints.py's prefix tokens): no importance correction under the default
    anchor, the learner's own log-prob under anchor = "behaviour"; both steps equal a step without
    behaviour log-probs."""
    def batch(nan: bool):
        b = make_batch()
        for g in b.groups:
            g.behav_logprobs = [[math.nan] * len(r) for r in g.responses] if nan else None
        return b
    plain = learner_for(tiny, lr=1e-3)
    plain.train_step(batch(False))
    for anchor in ("current", "behaviour"):
        hinted = learner_for(tiny, lr=1e-3, anchor=anchor)
        assert math.isfinite(hinted.train_step(batch(True))["loss"])
        w, w_plain = weights(hinted), weights(plain)
        assert max((w[k] - w_plain[k]).abs().max().item() for k in w) < 1e-6, anchor
    assert max((w_plain[k] - learner_for(tiny).policy.lm.state_dict()[k]).abs().max().item() for k in w_plain) > 1e-5
