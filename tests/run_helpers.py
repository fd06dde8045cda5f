"""What the tests of whole `memr1 train` runs share: config overrides for a tiny, fast run and its metrics."""
import json
from pathlib import Path


def overrides(model, run_dir, steps, stages=("manager", "answer")):
    out = [f"generator.model={model}", "generator.backend=hf", "generator.max_model_len=2048", "embedder=hash",
           "data.n=3", f"run_dir={run_dir}", "extract.source=oracle", f"stages={list(stages)}",
           "manager.max_new_tokens=8", "answer.max_new_tokens=4", "answer.distill=false", "eval.progress=false"]
    for s in ("manager", "answer", "manager_warm", "answer_warm"):
        out += [f"stage.{s}.steps={steps}", f"stage.{s}.prompts_per_step=2", f"stage.{s}.lr=1e-4"]
        out += [f"stage.{s}.group_size={1 if s.endswith('_warm') else 2}"]
    return out


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
