"""torch.profiler traces of chosen training steps (`profile.steps`, or `memr1 train --profile`).

A profiled step's window opens when the producer thread starts that step's rollout and closes when the
learner has trained it and synced the weights, so one trace holds generate, parse, fork_apply,
frozen_answers and reward (producer thread), and learner_forward, learner_backward, optimizer,
weight_sync and weight_export (learner thread): the named ranges of rl/spans.py. Both threads are
recorded (the profiler's profile_all_threads). With loop.max_staleness > 0 rollouts overlap training,
so a window also shows the neighbouring step's work, and when the next profiled step's rollout starts
inside an open window the two share one trace, step_<N>-<M>.json.

Traces are Chrome-trace JSON (Perfetto and chrome://tracing open them) at
<run_dir>/profile/<stage>/step_<N>.json; CUDA activities are added when CUDA is available.
Steps not named pay nothing: no torch profiler runs outside a window (and with profile.steps empty no
StepProfiler exists), and spans are then no-ops.
"""
import threading
from pathlib import Path
from typing import Annotated

import msgspec
from msgspec import Meta

DEFAULT_STEPS = [2, 3]   # `memr1 train --profile`: past the first step's warm-up, and one more


class ProfileConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # each stage's steps (1-based, as metrics.jsonl counts them) to trace; [] = none
    steps: list[Annotated[int, Meta(ge=1, le=1_000_000)]] = []


class StepProfiler:
    """Opened by the loop: `begin(step)` from the producer thread before a rollout, `end(step)` from
    the learner thread after that step's sync, `close()` when the loop ends."""

    def __init__(self, steps, out_dir: Path, cuda: bool | None = None):
        self.steps, self.out_dir = set(steps), Path(out_dir)
        self.cuda = cuda
        self.lock = threading.Lock()
        self.active = None          # the open torch profiler
        self.covering: list[int] = []   # the steps the open window holds
        self.written: list[Path] = []
        from torch.profiler import profile
        try:   # a window opens in the producer thread and closes in the learner's: every thread is recorded
            from torch.profiler import _ExperimentalConfig
            self.config = _ExperimentalConfig(profile_all_threads=True)
        except (ImportError, TypeError):
            raise RuntimeError("profile.steps needs torch.profiler's profile_all_threads, which this torch "
                               "lacks") from None
        # Kineto must first start in the thread that registered it, else a window opened from the
        # producer thread logs an init error: one empty profile here, in the learner's thread.
        with profile(activities=self._activities()):
            pass

    def begin(self, step: int) -> None:
        if step not in self.steps:
            return
        with self.lock:
            if self.active is None:
                self.active = self._start()
            self.covering.append(step)

    def end(self, step: int) -> None:
        with self.lock:
            if self.active is not None and self.covering and step >= self.covering[-1]:
                self._finish()

    def close(self) -> None:
        with self.lock:
            if self.active is not None:
                self._finish()

    def _activities(self) -> list:
        import torch
        from torch.profiler import ProfilerActivity

        cuda = self.cuda if self.cuda is not None else torch.cuda.is_available()
        return [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]

    def _start(self):
        from torch.profiler import profile

        prof = profile(activities=self._activities(), experimental_config=self.config)
        prof.start()
        return prof

    def _finish(self) -> None:
        prof, steps = self.active, self.covering
        self.active, self.covering = None, []
        prof.stop()
        name = f"step_{steps[0]}" if len(steps) == 1 else f"step_{steps[0]}-{steps[-1]}"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"{name}.json"
        try:
            prof.export_chrome_trace(str(path))
        except OSError as e:   # a trace that cannot be written never stops the training
            print(f"warning: could not write the profiler trace {path}: {e}")
            return
        self.written.append(path)
