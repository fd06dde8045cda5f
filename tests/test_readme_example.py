"""The examples README.md shows run as written: the memory-bank snippet as a doctest, and the block that
trains your own model on your own data, on the tiny random model with small-run settings appended."""
import doctest
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from run_helpers import env

ROOT = Path(__file__).resolve().parents[1]


def block(name: str) -> str:
    """The fenced block between `<!-- example:NAME begin -->` and its end marker, fences left out."""
    text = (ROOT / "README.md").read_text()
    inside = text.split(f"<!-- example:{name} begin -->", 1)[1].split(f"<!-- example:{name} end -->", 1)[0]
    lines = inside.strip().splitlines()
    assert lines[0].startswith("```") and lines[-1] == "```", f"example:{name} must hold one fenced block"
    return "\n".join(lines[1:-1]) + "\n"


def commands(text: str) -> list[list[str]]:
    """The shell block's commands as argv lists: continuations joined, comments dropped."""
    return [shlex.split(line, comments=True) for line in text.replace("\\\n", " ").splitlines() if line.strip()]


def test_readme_bank_snippet_runs_as_a_doctest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # the snippet creates banks/demo in the working folder
    test = doctest.DocTestParser().get_doctest(block("bank"), {}, "README.md:bank", "README.md", 0)
    runner = doctest.DocTestRunner()
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0 and runner.tries > 5
    assert (tmp_path / "banks" / "demo" / "MANIFEST.json").is_file()


# The README's commands are full size; these make them a few steps on a tiny model. None of them sets
# a key the example sets (generator.model, run_dir, data.path) but extract.source: a random tiny model
# extracts no facts, so the run reads the synthetic file's own (the README's "model" is for a real one).
SMALL = ["generator.backend=hf", "generator.max_model_len=2048", "embedder=hash", "extract.max_new_tokens=8",
         "manager.max_new_tokens=8", "answer.max_new_tokens=4", "eval.max_turns=6", "eval.max_questions=1",
         "eval.resamples=100", "eval.progress=false", "learner.train_layers=0", "extract.source=oracle", "items.window_turns=4", "loop.probe_every=0", "cache_dir=cache",
         *(f"stage.{s}.{k}" for s in ("manager_warm", "answer_warm", "answer", "manager")
           for k in ("steps=1", "prompts_per_step=2", "lr=1e-4")),
         "stage.answer.group_size=2", "stage.manager.group_size=2",
         "stage.manager_warm.examples=3", "stage.answer_warm.examples=3"]


@pytest.mark.slow
def test_readme_own_model_and_data_example_trains(tiny_model, tmp_path):
    """`memr1 data synth`, then `memr1 train` on that file with your model, run as the README writes them
    (from a folder with the repository's configs/); the torchrun line passes the same arguments."""
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    cmds = [[a.replace("/path/to/hf-model", str(tiny_model)) for a in argv] for argv in commands(block("own-data"))]
    assert cmds[0][:2] == ["source", ".venv/bin/activate"]
    synth, train, torchrun = cmds[1:]
    assert synth[:3] == ["memr1", "data", "synth"] and train[:2] == ["memr1", "train"]
    assert torchrun[0] == "torchrun" and torchrun[torchrun.index("train") + 1:] == train[2:]
    assert f"generator.model={tiny_model}" in train and any(a.startswith("data.path=") for a in train)
    for argv in (synth, train + SMALL):
        proc = subprocess.run([sys.executable, "-m", "memr1.engine.cli", *argv[1:]], cwd=tmp_path, env=env(),
                              capture_output=True, text=True, timeout=1200)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "runs" / "mine"
    stages = {json.loads(line)["stage"] for line in (run / "metrics.jsonl").read_text().splitlines()}
    assert stages == {"manager_warm", "answer_warm", "answer", "manager"}
    summary = json.loads((run / "eval" / "summary.json").read_text())
    assert {"base", "warm", "trained"} <= set(summary["rows"]) and summary["cluster"] == "conversation"
    assert os.path.isfile(run / "config.toml")
