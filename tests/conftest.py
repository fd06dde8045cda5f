import math
import os

import pytest

# Triton's interpreter must be chosen before triton is imported anywhere.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu need CUDA: without it they skip here, before any fixture of theirs is set up."""
    marked = [item for item in items if item.get_closest_marker("gpu")]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="marked gpu: needs a CUDA device")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture
def gate(monkeypatch):
    """A bank's compaction builds wait until the test opens the gate (gate.set()), so the test decides what
    happens while one is in flight; the gate opens at the end in any case."""
    import threading

    from memr1.memory_store import compaction

    opened, real = threading.Event(), compaction.build

    def gated_build(*args):
        assert opened.wait(60), "the test never opened the gate"
        return real(*args)
    monkeypatch.setattr(compaction, "build", gated_build)
    yield opened
    opened.set()


@pytest.fixture
def poisoned(monkeypatch):
    """Fill every fresh torch.empty buffer with NaN, so an element a kernel forgets to write shows."""
    import torch

    real_empty, real_like = torch.empty, torch.empty_like

    def empty(*a, **k):
        t = real_empty(*a, **k)
        return t.fill_(math.nan) if t.is_floating_point() else t

    def empty_like(*a, **k):
        t = real_like(*a, **k)
        return t.fill_(math.nan) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch, "empty_like", empty_like)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """The folder of the tiny random Llama with SmolLM2's tokenizer (tiny_model.py), built once per session
    and shared: tests read it and never write into it. Building it leaves torch's RNG as it was."""
    import torch
    from tiny_model import tiny_llama

    with torch.random.fork_rng(devices=[]):
        return tiny_llama(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """The folder of a tiny random Llama with a VOCAB-token vocabulary and no tokenizer, for the learner's
    tests (learner_helpers.py), built once per session and shared: tests never write into it. Building it
    leaves torch's RNG as it was."""
    import torch
    from learner_helpers import tiny_learner_model

    with torch.random.fork_rng(devices=[]):
        return tiny_learner_model(tmp_path_factory.mktemp("tiny"))
