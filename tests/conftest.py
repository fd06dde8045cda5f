import math
import os

import pytest

# Triton's interpreter must be chosen before triton is imported anywhere.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
