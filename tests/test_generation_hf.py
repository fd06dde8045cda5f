"""The transformers reference backend: contract, logprob fidelity, weight updates, bad input.
Most tests use a tiny random Llama (the real model adds nothing there); one checks the real one."""
import msgspec
import pytest
import torch

from memr1.bench.rollout import fp32_logprob_mad as mean_abs_diff
from memr1.engine.generation import make_generator
from memr1.engine.generation.base import cut_at_stop
from memr1.engine.generation.config import GeneratorConfig
from memr1.rl.generation import SamplingConfig
from manifest_cases import bad_manifests, recording_producer


@pytest.fixture(scope="module")
def tiny(tiny_model):
    folder = tiny_model
    gen = make_generator(GeneratorConfig(backend="hf", model=str(folder), max_model_len=64))
    return gen, folder


def test_result_shape_and_fields(tiny):
    gen, _ = tiny
    prompts = [[1, 5, 9, 200], [7, 8]]
    out = gen.generate(prompts, 3, SamplingConfig(max_new_tokens=6, ignore_eos=True, seed=0))
    assert len(out) == 2 and all(len(row) == 3 for row in out)
    for i, row in enumerate(out):
        for c in row:
            assert c.prompt_index == i and c.prompt_token_ids == prompts[i]
            assert len(c.token_ids) == len(c.logprobs) == 6
            assert c.finish_reason == "length" and c.weight_version == 0
            assert all(lp <= 0 for lp in c.logprobs)


def test_seed_reproduces_samples(tiny):
    gen, _ = tiny
    s = SamplingConfig(max_new_tokens=8, ignore_eos=True, seed=3)
    a = gen.generate([[1, 2, 3]], 2, s)
    b = gen.generate([[1, 2, 3]], 2, s)
    assert [c.token_ids for c in a[0]] == [c.token_ids for c in b[0]]


def test_logprobs_match_fp32_recompute_with_left_padding(tiny):
    from transformers import AutoModelForCausalLM

    gen, folder = tiny
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    # Different prompt lengths force left padding in the batch.
    out = gen.generate([[1, 40, 41, 42, 43, 44, 45], [9, 10]], 2,
                       SamplingConfig(temperature=0.7, max_new_tokens=10, ignore_eos=True, seed=1))
    assert mean_abs_diff(ref, [c for row in out for c in row], 0.7) <= 1e-3


def fresh(named):
    """A producer that makes each tensor on demand, as a sharded learner's export does."""
    for name, p in named:
        yield name, p.detach().clone()


@pytest.mark.parametrize("streamed", [False, True])
def test_update_weights_then_logprobs_follow_new_weights(tiny, streamed):
    from transformers import AutoModelForCausalLM

    gen, folder = tiny
    new = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    old = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    torch.manual_seed(5)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.5 * torch.randn_like(p))
    if streamed:  # the manifest path must load exactly what the list path loads
        manifest = {k: tuple(p.shape) for k, p in new.named_parameters()}
        gen.update_weights(fresh(new.named_parameters()), version=7, manifest=manifest)
    else:
        gen.update_weights(new.named_parameters(), version=7)
    try:
        assert gen.weight_version == 7 and not gen.needs_weights
        assert all(torch.equal(p, gen.model.state_dict()[k]) for k, p in new.state_dict().items())
        out = gen.generate([[1, 2, 3, 4]], 2, SamplingConfig(temperature=0.9, max_new_tokens=8, ignore_eos=True))
        flat = out[0]
        assert all(c.weight_version == 7 for c in flat)
        assert mean_abs_diff(new, flat, 0.9) <= 1e-3
        assert mean_abs_diff(old, flat, 0.9) > 1e-2  # really the new weights, not the old ones
    finally:
        gen.update_weights(old.named_parameters(), version=0)


def test_streamed_update_releases_each_tensor(tiny):
    from torch.multiprocessing.reductions import StorageWeakRef

    gen, _ = tiny
    named = [(k, v.clone()) for k, v in gen.model.named_parameters()]
    refs, live = [], []

    def producer():
        for name, t in named:
            live.append(sum(not r.expired() for r in refs))  # memory still held, aliases included
            t = t.clone()
            refs.append(StorageWeakRef(t.untyped_storage()))
            yield name, t

    gen.update_weights(producer(), version=0, manifest=gen.named_shapes())
    assert len(refs) == len(named) > 10 and max(live) <= 1  # copied in, then dropped


def test_bad_manifest_loads_and_draws_nothing(tiny):
    gen, _ = tiny
    before = {k: v.clone() for k, v in gen.model.state_dict().items()}
    shapes = gen.named_shapes()
    drawn = []
    for word, manifest in bad_manifests(shapes).items():
        with pytest.raises(ValueError, match=f"nothing was loaded.*{word}"):
            gen.update_weights(recording_producer(before, drawn), version=99, manifest=manifest)
        assert drawn == [] and gen.weight_version == 0 and not gen.needs_weights
        assert all(torch.equal(before[k], v) for k, v in gen.model.state_dict().items()), word


@pytest.mark.parametrize("break_at, word", [(5, "shape"), (None, "ended without")])
def test_stream_breaking_its_manifest_blocks_generation_until_a_full_update(tiny, break_at, word):
    gen, _ = tiny
    good = [(k, v.clone()) for k, v in gen.model.named_parameters()]
    bad = [(k, v + 1.0) for k, v in good]
    if break_at is None:  # the producer stops early: the tail never arrives
        bad = bad[:len(bad) // 2]
    else:
        bad[break_at] = (bad[break_at][0], torch.zeros(3))
    with pytest.raises(ValueError, match=f"broke its manifest.*{word}"):
        gen.update_weights(iter(bad), version=5, manifest=gen.named_shapes())
    assert gen.needs_weights and gen.weight_version == 0
    assert torch.equal(gen.model.get_parameter(good[0][0]), bad[0][1])  # it was partly loaded
    with pytest.raises(RuntimeError, match="update_weights"):
        gen.generate([[1, 2, 3]], 1, SamplingConfig(max_new_tokens=2))
    with pytest.raises(ValueError, match="missing"):  # a refused set leaves the flag set
        gen.update_weights(good[1:], version=6)
    assert gen.needs_weights
    gen.update_weights(good, version=0)
    assert not gen.needs_weights
    assert all(torch.equal(gen.model.get_parameter(k), v) for k, v in good)
    gen.generate([[1, 2, 3]], 1, SamplingConfig(max_new_tokens=2))


def test_bad_weight_sets_load_nothing(tiny):
    gen, _ = tiny
    before = {k: v.clone() for k, v in gen.model.state_dict().items()}
    good = [(k, v + 1.0) for k, v in before.items() if k != "lm_head.weight"]
    cases = {
        "shape": good[:-1] + [(good[-1][0], torch.zeros(3))],
        "no such weight": good + [("model.layers.9.mlp.up_proj.weight", torch.zeros(3))],
        "missing": good[:-2],
        "not floating": good[:-1] + [(good[-1][0], good[-1][1].long())],
    }
    for word, tensors in cases.items():
        with pytest.raises(ValueError, match=word):
            gen.update_weights(tensors, version=99)
        assert gen.weight_version == 0
        assert all(torch.equal(before[k], v) for k, v in gen.model.state_dict().items()), word


@pytest.mark.parametrize("prompts, n, match", [
    ([], 1, "non-empty"),
    ([[]], 1, "empty"),
    ([[1, 2]], 0, "n "),
    ([[1, 2]], -3, "n "),
    ([[1, 10**6]], 1, "outside"),
    ([[1, "a"]], 1, "all ints"),
    ([list(range(1, 61))], 1, "max_model_len"),
    ([[{"role": "user"}]], 1, "content"),
])
def test_bad_input_raises_clearly(tiny, prompts, n, match):
    gen, _ = tiny
    with pytest.raises(ValueError, match=match):
        gen.generate(prompts, n, SamplingConfig(max_new_tokens=8))


def test_bad_sampling_raises(tiny):
    gen, _ = tiny
    for bad, match in [(SamplingConfig(max_new_tokens=0), "max_new_tokens"),
                       (SamplingConfig(max_new_tokens=64), "max_new_tokens"),
                       (SamplingConfig(max_new_tokens=8, top_p=0.0), "top_p"),
                       (SamplingConfig(max_new_tokens=8, top_k=0), "top_k"),
                       (SamplingConfig(max_new_tokens=8, temperature=-1.0), "temperature"),
                       (SamplingConfig(max_new_tokens=8, stop=[""]), "stop")]:
        with pytest.raises(ValueError, match=match):
            gen.generate([[1, 2]], 1, bad)


def test_truncation_keeps_the_prompt_tail(tiny):
    gen, _ = tiny
    gen.cfg = msgspec.structs.replace(gen.cfg, truncate_prompts=True)
    try:
        long = list(range(1, 61))
        out = gen.generate([long], 1, SamplingConfig(max_new_tokens=8, ignore_eos=True))
        assert out[0][0].prompt_token_ids == long[-(64 - 8):]
        assert len(out[0][0].token_ids) == 8
    finally:
        gen.cfg = msgspec.structs.replace(gen.cfg, truncate_prompts=False)


def test_chat_prompts_use_the_chat_template(tiny):
    gen, _ = tiny
    msgs = [{"role": "user", "content": "hi"}]
    out = gen.generate([msgs], 1, SamplingConfig(max_new_tokens=2, ignore_eos=True))
    text = gen.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert out[0][0].prompt_token_ids == gen.tokenizer.encode(text, add_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n")


def test_make_generator_rejects_bad_config(tmp_path):
    with pytest.raises(ValueError, match="backend"):
        make_generator(GeneratorConfig(backend="tpu"))
    with pytest.raises(ValueError, match="config.json"):
        make_generator(GeneratorConfig(backend="hf", model=str(tmp_path)))
    with pytest.raises(ValueError, match="sleep_level"):
        make_generator(GeneratorConfig(backend="hf", sleep_level=3))


def test_cut_at_stop():
    assert cut_at_stop("abc STOP def", ["STOP", "def"]) == ("abc ", True)
    assert cut_at_stop("abc", ["x"]) == ("abc", False)


@pytest.mark.slow
def test_real_model_answers_and_stops():
    gen = make_generator(GeneratorConfig(backend="hf", max_model_len=512))
    q = [[{"role": "user", "content": "What is the capital of France?"}]]
    c = gen.generate(q, 1, SamplingConfig(temperature=0.0, max_new_tokens=12))[0][0]
    assert c.text.strip() == "The capital of France is Paris." and c.finish_reason == "stop"
    assert c.token_ids[-1] == gen.tokenizer.convert_tokens_to_ids("<|im_end|>")
    s = gen.generate(q, 1, SamplingConfig(temperature=0.0, max_new_tokens=12, stop=[" Paris"]))[0][0]
    assert s.text == "The capital of France is" and s.finish_reason == "stop"
    assert s.token_ids == c.token_ids[:len(s.token_ids)] and len(s.token_ids) < len(c.token_ids)


def test_checkpoint_manifest_reads_headers(tiny):
    from memr1.engine.generation.weights import checkpoint_manifest

    gen, folder = tiny
    assert checkpoint_manifest(folder) == gen.named_shapes()
    with pytest.raises(ValueError, match="safetensors"):
        checkpoint_manifest(folder / "nowhere")


@pytest.mark.parametrize("native", [True, False])
def test_fast_dtype_is_bf16_only_where_the_hardware_has_it(tiny, monkeypatch, native):
    """generator.dtype = "fast": bf16 on hardware that multiplies it natively, else the checkpoint's
    dtype (the tiny checkpoint is fp32)."""
    from memr1.engine.generation.config import engine_dtype
    from memr1.engine.observe import throughput
    monkeypatch.setattr(throughput, "native_bf16", lambda device="cpu": native)
    assert engine_dtype("fast") == ("bfloat16" if native else "auto") and engine_dtype("float32") == "float32"
    _, folder = tiny
    gen = make_generator(GeneratorConfig(backend="hf", model=str(folder), max_model_len=64, dtype="fast"))
    assert next(gen.model.parameters()).dtype == (torch.bfloat16 if native else torch.float32)
