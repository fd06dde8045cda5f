"""Importing TRL's trainers without pandas, datasets or pyarrow.

TRL is installed without its dependencies (`trl==1.16.0`, Makefile). Its GRPO module and
`trl.trainer.utils` import pandas and datasets (and through them pyarrow) at import time, for logging
and dataset handling only. When those are missing, `stub_missing_trl_imports()` installs empty
stand-in modules for them; the benches record which in their JSON (`trl_stubs`).
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types


class _Stub(types.ModuleType):
    """A module whose every attribute is a fresh empty class: enough for imports and isinstance checks."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {})
        setattr(self, name, value)
        return value


def stub_missing_trl_imports() -> list[str]:
    """Empty stand-ins for modules TRL imports but the timed paths never use; returns their names."""
    stubbed = []
    for top, subs in (("pandas", ()), ("datasets", ("fingerprint",)), ("pyarrow", ("compute", "types"))):
        if isinstance(sys.modules.get(top), _Stub):  # stubbed by an earlier call
            stubbed.append(top)
            continue
        if top in sys.modules or importlib.util.find_spec(top) is not None:
            continue
        for name in (top, *(f"{top}.{sub}" for sub in subs)):
            sys.modules[name] = _Stub(name)
            sys.modules[name].__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            sys.modules[name].__path__ = []
            sys.modules[name].__version__ = "0"
        for sub in subs:
            setattr(sys.modules[top], sub, sys.modules[f"{top}.{sub}"])
        stubbed.append(top)
    return stubbed


def prompt_dataset(n: int, stubbed: list[str]):
    """GRPOTrainer wants a dataset of prompts; the timed loss path never reads it."""
    import datasets
    rows = [{"prompt": "x"}] * n
    if "datasets" not in stubbed:
        return datasets.Dataset.from_list(rows)

    class Rows(datasets.Dataset):
        column_names, cache_files = ["prompt"], []
        __len__ = lambda self: n  # noqa: E731
        __getitem__ = lambda self, i: rows[i]  # noqa: E731
    return Rows()
