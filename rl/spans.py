"""Named ranges for the profiler: `with span("generate"): ...` shows up as a range in a torch.profiler
trace (engine/observe/profiling.py records the steps `profile.steps` names).

Outside a profiled step a span is a nullcontext: torch's record_function costs microseconds even with no
profiler running, and these wrap every phase of every step. torch is never imported here; if nothing
imported it, no profiler can be running.
"""
import sys
from contextlib import nullcontext

# Every name the code opens, in the order a step runs them (the report lists ranges in this order).
# Nesting: generate, parse, fork_apply, frozen_answers and reward lie inside rollout (producer thread);
# learner_forward, learner_backward and optimizer inside train_step; weight_export inside weight_sync.
RANGES = ("rollout", "generate", "parse", "fork_apply", "frozen_answers", "reward",
          "train_step", "learner_forward", "learner_backward", "optimizer", "weight_sync", "weight_export")

_OFF = nullcontext()


def span(name: str):
    profiler = sys.modules.get("torch.autograd.profiler")
    if profiler is None or not getattr(profiler, "_is_profiler_enabled", True):
        return _OFF
    return profiler.record_function(name)
