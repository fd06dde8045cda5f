"""vLLM engines of one process share module state (get_rope's rotary cache), so the backend runs no two
engine calls at once: generate, weight reload and prefix-cache reset all hold vllm_backend.ENGINE_LOCK.
Checked with a stand-in for vLLM's LLM object, so no engine starts."""
import importlib.util
import threading

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")


def held_by_another_thread(lock) -> bool:
    got = []

    def probe():
        got.append(lock.acquire(blocking=False))
        if got[0]:
            lock.release()
    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return not got[0]


class FakeLLM:
    def __init__(self, lock):
        self.lock, self.calls = lock, []

    def _seen(self, name):
        self.calls.append((name, held_by_another_thread(self.lock)))

    def generate(self, prompts, params, use_tqdm=False):
        self._seen("generate")
        return []

    def collective_rpc(self, fn):
        self._seen("collective_rpc")

    def reset_prefix_cache(self):
        self._seen("reset_prefix_cache")


def test_every_engine_call_holds_the_process_wide_lock():
    from memr1.engine.generation import vllm_backend as vb
    from memr1.engine.generation.config import GeneratorConfig
    from memr1.rl.generation import SamplingConfig

    gen = object.__new__(vb.VLLMGenerator)   # no engine: only the call paths are under test
    gen.cfg, gen.llm = GeneratorConfig(backend="vllm", max_model_len=64), FakeLLM(vb.ENGINE_LOCK)
    gen.tokenizer, gen.vocab_size, gen.on_gpu, gen.model_dtype = None, 100, False, torch.float32
    gen.asleep, gen.needs_weights, gen.weight_version, gen.expected = False, False, 0, {"w": (2,)}
    gen.generate([[1, 2, 3]], 2, SamplingConfig(max_new_tokens=4))
    gen.update_weights([("w", torch.zeros(2))], 1)
    assert gen.llm.calls == [("generate", True), ("collective_rpc", True), ("reset_prefix_cache", True)]
    assert gen.weight_version == 1 and not held_by_another_thread(vb.ENGINE_LOCK)
