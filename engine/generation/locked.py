"""What engine/loop.py's rollout producer hands a stage in place of the policy generator."""
import threading


class LockedGenerator:
    """The policy generator as a stage sees it during one rollout: each generate call holds the loop's
    lock, so a weight sync waits for the call in flight, not for the rest of the rollout (parsing, bank
    forks, scoring). (vLLM engines of one process also serialise every call among themselves, the
    frozen answer agent's included: vllm_backend.ENGINE_LOCK.)"""

    def __init__(self, generator, lock: threading.Lock):
        self._generator, self._lock = generator, lock
        self._start = generator.weight_version
        self._versions: list[int] = []

    def generate(self, *args, **kwargs):
        with self._lock:
            self._versions.append(self._generator.weight_version)
            return self._generator.generate(*args, **kwargs)

    @property
    def weight_version(self) -> int:
        """The oldest weights this rollout sampled with (the version at its start if it sampled nothing),
        not the live version a sync may have moved on: what the batch's staleness counts from."""
        return min(self._versions, default=self._start)

    def __getattr__(self, name):
        return getattr(self._generator, name)
