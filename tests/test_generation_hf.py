"""The transformers reference backend: contract, logprob fidelity, weight updates, bad input.
Most tests use a tiny random Llama (the real model adds nothing there); one checks the real one."""
import msgspec
import pytest
import torch

from memr1.engine.generation import Completion, GeneratorConfig, SamplingConfig, make_generator
from memr1.engine.generation.base import cut_at_stop
from tiny_model import tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tiny_llama(tmp_path_factory.mktemp("tiny"))
    gen = make_generator(GeneratorConfig(backend="hf", model=str(folder), max_model_len=64))
    return gen, folder


def reference_logprobs(model, c: Completion, temperature: float) -> torch.Tensor:
    seq = torch.tensor([c.prompt_token_ids + c.token_ids])
    with torch.no_grad():
        logits = model(seq).logits[0, len(c.prompt_token_ids) - 1:-1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]


def mean_abs_diff(model, completions, temperature) -> float:
    diffs = [(reference_logprobs(model, c, temperature) - torch.tensor(c.logprobs)).abs() for c in completions]
    return torch.cat(diffs).mean().item()


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


def test_update_weights_then_logprobs_follow_new_weights(tiny):
    from transformers import AutoModelForCausalLM

    gen, folder = tiny
    new = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    old = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    torch.manual_seed(5)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.5 * torch.randn_like(p))
    gen.update_weights(new.named_parameters(), version=7)
    try:
        assert gen.weight_version == 7
        out = gen.generate([[1, 2, 3, 4]], 2, SamplingConfig(temperature=0.9, max_new_tokens=8, ignore_eos=True))
        flat = out[0]
        assert all(c.weight_version == 7 for c in flat)
        assert mean_abs_diff(new, flat, 0.9) <= 1e-3
        assert mean_abs_diff(old, flat, 0.9) > 1e-2  # really the new weights, not the old ones
    finally:
        gen.update_weights(old.named_parameters(), version=0)


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


def test_real_model_answers_and_stops():
    gen = make_generator(GeneratorConfig(backend="hf", max_model_len=512))
    q = [[{"role": "user", "content": "What is the capital of France?"}]]
    c = gen.generate(q, 1, SamplingConfig(temperature=0.0, max_new_tokens=12))[0][0]
    assert c.text.strip() == "The capital of France is Paris." and c.finish_reason == "stop"
    assert c.token_ids[-1] == gen.tokenizer.convert_tokens_to_ids("<|im_end|>")
    s = gen.generate(q, 1, SamplingConfig(temperature=0.0, max_new_tokens=12, stop=[" Paris"]))[0][0]
    assert s.text == "The capital of France is" and s.finish_reason == "stop"
    assert s.token_ids == c.token_ids[:len(s.token_ids)] and len(s.token_ids) < len(c.token_ids)


def test_buckets_are_bounded_and_complete():
    from memr1.engine.generation.weights import buckets, stream

    tensors = [(f"w{i}", torch.ones(256, 1024)) for i in range(10)]  # 1 MiB each in fp32
    got = list(buckets(tensors, 3, torch.device("cpu"), torch.float32))
    assert [len(b) for b in got] == [3, 3, 3, 1]
    assert got[0][0][1].data_ptr() == tensors[0][1].data_ptr()  # same device and dtype: no copy
    halves = list(buckets(tensors, 3, torch.device("cpu"), torch.bfloat16))
    assert [len(b) for b in halves] == [6, 4] and halves[0][0][1].dtype == torch.bfloat16
    assert [n for n, _ in stream(tensors, 3, torch.device("cpu"), torch.float32)] == [n for n, _ in tensors]


def test_checkpoint_manifest_reads_headers(tiny):
    from memr1.engine.generation.weights import checkpoint_manifest

    gen, folder = tiny
    assert checkpoint_manifest(folder) == gen.named_shapes()
    with pytest.raises(ValueError, match="safetensors"):
        checkpoint_manifest(folder / "nowhere")
