"""LoRA in the learner (engine/training/lora.py, through peft): only the adapters train; the weights the
generator receives are the learner's model (its log-probs, within the backends' fidelity bound); a
checkpoint's model.safetensors loads in transformers as is and its adapter in peft; a resume restores
the adapter and its optimizer state exactly; bad settings are refused in one line."""
import pytest
import torch

from memr1.bench.rollout import fp32_logprob_mad as mean_abs_diff
from memr1.engine.checkpoints import io as checkpoint
from memr1.engine.checkpoints.files import ADAPTER_DIR, verify
from memr1.engine.training.config import LearnerConfig, LoraConfig
from memr1.engine.training.learner import Learner
from learner_helpers import make_batch

LORA = LoraConfig(rank=4, alpha=8.0)


def make(model, lora=LORA, lr=5e-2, **kw) -> Learner:
    torch.manual_seed(0)
    return Learner(LearnerConfig(lora=lora, activation_checkpointing=False, **kw), str(model), lr=lr)


def params(learner) -> dict:
    return {n: p.detach().clone() for n, p in learner.policy.lm.named_parameters()}


def test_only_the_adapters_train_and_the_optimizer_holds_nothing_else(tiny):
    learner = make(tiny)
    before = params(learner)
    for s in range(2):
        learner.train_step(make_batch(s))
    after = params(learner)
    adapters = [n for n in before if ".lora_A." in n or ".lora_B." in n]
    assert adapters and len(adapters) == 2 * 7 * 2   # A and B of 7 projections in each of 2 blocks
    assert all(torch.equal(before[n], after[n]) for n in before if n not in adapters)
    assert all(not torch.equal(before[n], after[n]) for n in adapters if ".lora_B." in n)
    assert learner.trainable_params == sum(before[n].numel() for n in adapters)
    live = dict(learner.policy.lm.named_parameters())
    assert {id(p) for g in learner.optim.param_groups for p in g["params"]} == {id(live[n]) for n in adapters}


def test_exported_weights_are_the_adapted_model_under_hf_names(tiny):
    from transformers import AutoModelForCausalLM

    learner = make(tiny)
    for s in range(2):
        learner.train_step(make_batch(s))
    exported = dict(learner.export_weights())
    assert {k: tuple(v.shape) for k, v in exported.items()} == learner.weight_manifest()
    plain = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    assert set(exported) == {n for n, _ in plain.named_parameters()}
    plain.load_state_dict(exported, strict=False)
    ids = torch.tensor([make_batch(5).groups[0].responses[0]])
    with torch.no_grad():
        ours = learner.policy.lm.eval()(ids).logits
        theirs = plain(ids).logits
    assert torch.allclose(ours, theirs, atol=1e-5)
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()(ids).logits
    assert not torch.allclose(ours, base, atol=1e-3)   # the adapters did move the model


@pytest.mark.parametrize("adapters", [True, False], ids=["adapter-only", "merged"])
def test_the_generator_samples_from_the_learners_adapted_model(tiny_model, monkeypatch, adapters):
    """A push of the LoRA learner's weights leaves the generator's log-probs on the learner's model,
    within the bound the full-model push meets (test_generation_hf.py): adapter-only pushes into the HF
    backend, which holds the adapters, and merged pushes into a backend that cannot hold them."""
    from memr1.engine.generation import make_generator
    from memr1.engine.generation.config import GeneratorConfig
    from memr1.engine.generation.hf import HFGenerator
    from memr1.engine.generation.weights import push_weights
    from memr1.rl.generation import SamplingConfig
    from transformers import AutoModelForCausalLM

    if not adapters:
        monkeypatch.setattr(HFGenerator, "hold_adapters", lambda self, config: False)
    learner = make(tiny_model)
    for s in range(3):
        learner.train_step(make_batch(s))
    gen = make_generator(GeneratorConfig(backend="hf", model=str(tiny_model), max_model_len=64))
    push_weights(learner, gen, 3)
    assert (gen.adapter_base == learner.base_token) == adapters and bool(gen.adapter_shapes()) == adapters
    flat = gen.generate([[1, 2, 3, 4]], 2, SamplingConfig(temperature=0.9, max_new_tokens=8, ignore_eos=True))[0]
    assert all(c.weight_version == 3 for c in flat)
    assert mean_abs_diff(learner.policy.lm.eval(), flat, 0.9) <= 1e-3
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    assert mean_abs_diff(base, flat, 0.9) > 1e-2


def test_adapter_only_pushes_move_the_base_once_per_learner_and_a_full_push_clears_them(tiny_model):
    """Into the HF backend: a LoRA learner's first push moves its base weights and its adapters, every
    later one A and B alone (their bytes exactly); a new learner (the next stage) moves its base again;
    a push of a learner without LoRA (or a checkpoint) zeroes the adapters, so the generator runs exactly
    the weights it was given; an adapter-only update into an engine holding none is refused in one line."""
    from memr1.engine.generation import make_generator
    from memr1.engine.generation.config import GeneratorConfig
    from memr1.engine.generation.weights import push_weights
    from memr1.engine.training import lora
    from memr1.rl.generation import SamplingConfig
    from transformers import AutoModelForCausalLM

    sampling = SamplingConfig(temperature=0.9, max_new_tokens=8, ignore_eos=True)
    gen = make_generator(GeneratorConfig(backend="hf", model=str(tiny_model), max_model_len=64))
    with pytest.raises(ValueError, match="holds no adapters"):
        gen.update_weights([], 1, part="adapter")
    learner = make(tiny_model)
    sizes = {n: p.nbytes for n, p in learner.policy.lm.named_parameters()}
    adapter_bytes = sum(b for n, b in sizes.items() if lora.is_adapter(n))
    assert push_weights(learner, gen, 0) == sum(sizes.values())
    for s in range(2):
        learner.train_step(make_batch(s))
        assert push_weights(learner, gen, s + 1) == adapter_bytes
    flat = gen.generate([[1, 2, 3, 4]], 2, sampling)[0]
    assert mean_abs_diff(learner.policy.lm.eval(), flat, 0.9) <= 1e-3
    assert push_weights(make(tiny_model), gen, 3) == sum(sizes.values())   # another learner: its base again

    plain = Learner(LearnerConfig(activation_checkpointing=False), str(tiny_model), lr=1e-3)
    push_weights(learner, gen, 4)
    push_weights(plain, gen, 5)
    assert gen.adapter_base is None
    assert all(not p.any() for n, p in gen.model.named_parameters() if ".lora_B." in n)
    flat = gen.generate([[1, 2, 3, 4]], 2, sampling)[0]
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    assert mean_abs_diff(base, flat, 0.9) <= 1e-3 and mean_abs_diff(learner.policy.lm.eval(), flat, 0.9) > 1e-2
    assert push_weights(learner, gen, 6) == sum(sizes.values())   # the base under the adapters was replaced


def test_a_checkpoint_loads_in_transformers_and_peft_and_resumes_exactly(tiny, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    straight = make(tiny)
    for s in range(3):
        straight.train_step(make_batch(s))
    first = make(tiny)
    first.train_step(make_batch(0))
    path = checkpoint.save(first, str(tmp_path / "stage"), 1, model_dir=str(tiny))
    assert verify(path) is None and (tmp_path / "stage/checkpoints/step_1" / ADAPTER_DIR).is_dir()
    ids = torch.tensor([make_batch(7).groups[0].responses[0]])
    with torch.no_grad():
        want = first.policy.lm.eval()(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()(ids).logits
        base = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
        adapted = PeftModel.from_pretrained(base, f"{path}/{ADAPTER_DIR}").eval()(ids).logits
    assert torch.allclose(merged, want, atol=1e-5) and torch.allclose(adapted, want, atol=1e-5)
    resumed = make(tiny)   # built from the start model, as a resumed stage is
    checkpoint.load(resumed, path)
    first.policy.lm.train()
    for s in (1, 2):
        resumed.train_step(make_batch(s))
    got, ref = params(resumed), params(straight)
    assert all(torch.allclose(got[n], ref[n], atol=1e-6) for n in ref)
    # a LoRA learner of another rank cannot take this adapter, nor a LoRA learner a full-model state
    with pytest.raises(ValueError, match="adapter does not match"):
        checkpoint.load(make(tiny, lora=LoraConfig(rank=8, alpha=8.0)), path)
    full = Learner(LearnerConfig(activation_checkpointing=False), str(tiny), lr=1e-2)
    full_path = checkpoint.save(full, str(tmp_path / "full"), 1, model_dir=str(tiny))
    with pytest.raises(ValueError, match="holds no adapter"):
        checkpoint.load(make(tiny), full_path)


def test_bad_lora_settings_are_refused_in_one_line(tiny):
    with pytest.raises(ValueError, match="set learner.train_layers = 0") as e:
        make(tiny, train_layers=1)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="no module of the model has such a name"):
        make(tiny, lora=LoraConfig(rank=4, targets=("nope_proj",)))


@pytest.mark.slow
def test_memr1_train_with_lora_writes_verified_adapter_checkpoints(tiny_model, tmp_path, monkeypatch, capsys):
    import os

    from memr1.engine.checkpoints.files import checkpoints
    from memr1.engine.cli import main
    from run_helpers import overrides, rows

    monkeypatch.chdir(os.path.dirname(os.path.dirname(__file__)))
    run = tmp_path / "run"
    args = overrides(tiny_model, run, 2, ("answer",)) + [
        "items.answer_banks=oracle", "eval_after=[]", "learner.lora.rank=4", "learner.lora.alpha=8",
        "loop.checkpoint_every=1", "checkpoint.keep_last=2"]
    assert main(["train", "--config", "configs/default.toml", *args]) == 0
    assert "stage answer: LoRA rank 4 on q_proj" in capsys.readouterr().out
    saved = checkpoints(run / "answer")
    assert [p.name for p in saved] == ["step_2", "step_1"]
    assert all(verify(p) is None and (p / ADAPTER_DIR / "adapter_model.safetensors").is_file() for p in saved)
    # the adapter is listed in the manifest: a changed byte is found
    f = saved[0] / ADAPTER_DIR / "adapter_model.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    assert "adapter/adapter_model.safetensors does not match its checksum" in verify(saved[0])
    assert [r["step"] for r in rows(run) if r.get("stage") == "answer" and "loss" in r] == [1, 2]
