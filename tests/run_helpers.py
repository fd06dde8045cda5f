"""What the tests of whole `memr1 train` (and `memr1 rollout`) runs share: config overrides for a tiny, fast
run, its metrics, and a child process's environment and port."""
import json
import os
import socket
from pathlib import Path


def overrides(model, run_dir, steps, stages=("manager", "answer")):
    out = [f"generator.model={model}", "generator.backend=hf", "generator.max_model_len=2048", "embedder=hash",
           "data.n=3", f"run_dir={run_dir}", "extract.source=oracle", f"stages={list(stages)}",
           "manager.max_new_tokens=8", "answer.max_new_tokens=4", "answer.distill=false", "eval.progress=false",
           "learner.train_layers=0"]   # the tiny model has 2 blocks; a config's count may be for a larger model
    for s in ("manager", "answer", "manager_warm", "answer_warm"):
        out += [f"stage.{s}.steps={steps}", f"stage.{s}.prompts_per_step=2", f"stage.{s}.lr=1e-4"]
        out += [f"stage.{s}.group_size={1 if s.endswith('_warm') else 2}"]
    return out


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def env() -> dict:
    """A child process's environment: one thread, offline, vLLM's INFO lines kept (a test asserts on them)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false", "VLLM_LOGGING_LEVEL": "INFO"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
