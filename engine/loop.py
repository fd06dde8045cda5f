"""The async actor-learner loop: one rollout producer thread feeds a bounded queue that the learner
drains, with a hard bound on how stale a consumed rollout may be.

Capacity is what enforces the bound: the producer starts rollout s only once the generator holds
weights of version >= v(s) - max_staleness, where v(s) is the learner version that will consume it
(s minus the rollouts skipped before it). So staleness = v(s) - version_sampled <= max_staleness, and
nothing is generated that would have to be thrown away. max_staleness = 0 is synchronous on-policy.

The loop knows nothing of Memory-R1: a Stage turns a step number into a TrainBatch (prompts ->
completions -> rewards), and the learner trains on it.

Data parallel (torchrun): each rank runs its own producer on its share of the step's prompts and trains
on its own groups; `agree` (training/dist.py) makes all ranks agree, with scalar all-reduces, on what to
do with a step: train it, skip it, stop, or raise. It runs in this (the learner) thread, so every
collective (agreement, FSDP step, weight export, checkpoint) is issued from one thread in the same
order on all ranks.
"""
import queue
import signal
import threading
import time
import traceback
from typing import Any, Callable, Protocol

from memr1.engine.config.run import LoopConfig
from memr1.engine.generation.locked import LockedGenerator
from memr1.engine.generation.weights import push_weights
from memr1.rl.records import Rollout, RolloutFailure
from memr1.rl.spans import span


class Stage(Protocol):
    name: str

    def rollout(self, step: int, generator) -> Rollout:
        """Sample and score the batch of `step` (chosen by step, so a resumed run sees the same data)."""


class Learner(Protocol):
    def train_step(self, batch) -> dict: ...
    def export_weights(self): ...   # (name, tensor) pairs, see generation.weights.push_weights
    def weight_manifest(self) -> dict: ...


def alone(item, step: int):
    """World 1: this process's item is the step's item (None: a stop was requested)."""
    return item


class RolloutError(RuntimeError):
    """A rollout producer raised; the message carries the step and the producer's traceback."""


class Loop:
    def __init__(self, stage: Stage, generator, learner: Learner, cfg: LoopConfig, steps: int,
                 on_step: Callable[[dict], None] = lambda m: None,
                 save_checkpoint: Callable[[int], None] = lambda step: None,
                 validate: Callable[[int], dict] | None = None, probe: Callable[[int], dict] | None = None,
                 agree: Callable[[Any, int], Any] = alone, profiler=None):
        if cfg.sync_every < 1 or cfg.max_staleness < 0:
            raise ValueError("loop.sync_every must be >= 1 and loop.max_staleness >= 0")
        if cfg.sleep_while_training and cfg.max_staleness != 0:
            raise ValueError("loop.sleep_while_training needs loop.max_staleness = 0: a sleeping generator "
                             "cannot produce the next rollout while the learner trains")
        if cfg.max_staleness < cfg.sync_every - 1:
            raise ValueError(f"loop.sync_every={cfg.sync_every} needs loop.max_staleness >= {cfg.sync_every - 1}: "
                             f"rollouts are sampled with weights up to sync_every-1 versions old")
        self.stage, self.generator, self.learner, self.cfg = stage, generator, learner, cfg
        self.steps, self.on_step, self.save_checkpoint, self.agree = steps, on_step, save_checkpoint, agree
        self.validate = validate   # step -> val_* metrics, run with the generator holding that step's weights
        self.probe = probe         # step -> probe_* metrics (the probe curve), every cfg.probe_every steps
        self.profiler = profiler   # observe/profiling.StepProfiler: traces the steps it names; None: no profiling
        self.sync_bytes = 0        # what the last weight sync moved
        self.queue: queue.Queue = queue.Queue(maxsize=cfg.max_staleness + 1)
        self.gen_lock = threading.Lock()       # generation and weight loading never overlap
        self.cond = threading.Condition()      # signals a new generator weight version / a stop
        self.stop_requested = False
        self.stop_signal = None    # the SIGINT/SIGTERM that stopped the run, if one did
        self.stats = {"skipped": 0}  # also sets the producer's capacity (updated under cond)

    # ---- producer thread ----
    def _produce(self, start: int, end: int, start_version: int) -> None:
        failed = 0
        for step in range(start, end):
            # Skipped steps train nothing: this rank's failures count at once, another rank's once the
            # learner has agreed to skip that step (it notifies).
            with self.cond:  # capacity: wait for weights recent enough for the step that consumes this
                self.cond.wait_for(lambda: self.stop_requested or self.generator.weight_version >= start_version
                                   + (step - start) - max(failed, self.stats["skipped"]) - self.cfg.max_staleness)
                if self.stop_requested:
                    return
            if self.profiler is not None:
                self.profiler.begin(step + 1)
            try:
                policy = LockedGenerator(self.generator, self.gen_lock)
                with span("rollout"):
                    rollout = self.stage.rollout(step, policy)
                rollout.step, rollout.weight_version = step, policy.weight_version
            except Exception as e:  # reported to the learner thread, never swallowed
                rollout = RolloutFailure(step, e, traceback.format_exc())
            self.queue.put(rollout)
            if isinstance(rollout, RolloutFailure):
                failed += 1
                if self.cfg.on_rollout_error == "stop":
                    return

    # ---- learner (the calling thread) ----
    def run(self, start_step: int = 0, start_version: int | None = None) -> dict:
        """Consume rollouts [start_step, steps). Each trained one bumps the weight version; the
        generator must hold `start_version` (default: start_step) when this starts."""
        self.at, self.version = start_step, start_step if start_version is None else start_version
        self.last, self.saved = {}, None   # saved: the step last checkpointed here
        producer = threading.Thread(target=self._produce, args=(start_step, self.steps, self.version), name="rollout",
                                    daemon=True)
        old_handlers = self._install_signal_handlers()
        producer.start()
        try:
            while self.at < self.steps and self.step(producer):
                pass
        except RolloutError:
            # Keep what trained before the failure (the producer touches no learner state, so this is
            # safe while it winds down); a resume runs the failed step again.
            if self.at - 1 > start_step and self.saved != self.at - 1:
                self.save_checkpoint(self.at - 1)
            raise
        finally:
            with self.cond:
                self.stop_requested = True
                self.cond.notify_all()
            self._drain(producer)
            self._restore_signal_handlers(old_handlers)
            if self.profiler is not None:
                self.profiler.close()
        if self.saved != self.at:
            self.save_checkpoint(self.at)
        return {"steps_done": self.at, "weight_version": self.version, "last": self.last,
                "stop_signal": self.stop_signal, **self.stats}

    def step(self, producer: threading.Thread) -> bool:
        """One step: take the next rollout, train on it, sync the weights (scoring them when due), log
        and checkpoint. False once a stop was requested."""
        t0 = time.perf_counter()
        item = self.agree(self._next_item(producer, self.at), self.at)   # every rank agrees, every step
        idle_s = time.perf_counter() - t0
        if item is None:
            return False
        self.at += 1
        if isinstance(item, RolloutFailure):
            self._handle_failure(item)
            return True
        metrics = self._train(item)
        self.version += 1
        metrics |= self._sync_and_score(self.at)
        self._record(item, metrics, idle_s, t0)
        return True

    def _train(self, item: Rollout) -> dict:
        """The learner's step on `item`, the generator asleep meanwhile when configured."""
        staleness = self.version - item.weight_version
        if staleness > self.cfg.max_staleness:  # cannot happen by construction
            raise RuntimeError(f"rollout of step {self.at} is {staleness} versions stale (bound {self.cfg.max_staleness})")
        sleep_s = self._set_awake(False)
        t = time.perf_counter()
        with span("train_step"):
            out = self.learner.train_step(item.batch)
        train_s = time.perf_counter() - t
        return {"learner": out, "staleness": staleness, "train_s": train_s, "sleep_s": sleep_s + self._set_awake(True)}

    def _sync_and_score(self, step: int) -> dict:
        """Push the weights when a sync, a validation or a probe is due, then run those two on them."""
        every, end = self.cfg.validate_every, self.steps
        validating = self.validate is not None and every and (step % every == 0 or step == end)
        probing = self.probe is not None and self.cfg.probe_every and (step % self.cfg.probe_every == 0 or step == end)
        due = self.version % self.cfg.sync_every == 0 or step == end or validating or probing
        sync_wait_s, sync_s = self._sync(self.version) if due else (0.0, 0.0)
        scores = {}
        for score, key in ((validating and self.validate, "val_s"), (probing and self.probe, "probe_s")):
            if score:
                t = time.perf_counter()
                with self.gen_lock:
                    scores.update(score(step))
                scores[key] = time.perf_counter() - t
        return {"scores": scores, "sync_s": sync_s, "sync_wait_s": sync_wait_s,
                "sync_bytes": self.sync_bytes if due else 0}

    def _record(self, item: Rollout, m: dict, idle_s: float, t0: float) -> None:
        """The step's metrics row (the loop's own keys win over the learner's counters), the profiler's
        end of step, and the periodic checkpoint."""
        step = self.at
        self.last = {**item.metrics, **m["learner"], **m["scores"], "step": step, "stage": self.stage.name,
                     "weight_version": self.version, "staleness": m["staleness"], "train_s": m["train_s"],
                     "sync_s": m["sync_s"], "sync_wait_s": m["sync_wait_s"], "idle_s": idle_s, "sleep_s": m["sleep_s"],
                     "sync_bytes": m["sync_bytes"], "step_s": time.perf_counter() - t0}
        if self.profiler is not None:   # after step_s: writing the trace is not the step's time
            self.profiler.end(step)
            if step in self.profiler.steps:
                self.last["profiled"] = True
        self.on_step(self.last)
        if self.cfg.checkpoint_every and step % self.cfg.checkpoint_every == 0:
            self.save_checkpoint(step)
            self.saved = step

    def _next_item(self, producer: threading.Thread, step: int):
        """This rank's rollout of `step`, a RolloutFailure, or None once a stop is requested."""
        while not self.stop_requested:
            try:
                return self.queue.get(timeout=0.5)
            except queue.Empty:
                if not producer.is_alive() and self.queue.empty():  # a failure, so the other ranks learn of it
                    err = RolloutError("the rollout producer stopped without producing the next step")
                    return RolloutFailure(step, err, "", fatal=True)
        return None

    def _handle_failure(self, f: RolloutFailure) -> None:
        if self.profiler is not None:
            self.profiler.end(f.step + 1)
        where = "" if f.rank is None else f" on rank {f.rank}"
        if self.cfg.on_rollout_error == "stop" or f.fatal:
            raise RolloutError(f"rollout for step {f.step} failed{where} with {f.what}\n"
                               f"--- producer traceback ---\n{f.trace}") from f.error
        with self.cond:  # a producer waiting on capacity counts this step out
            self.stats["skipped"] += 1
            self.cond.notify_all()
        self.on_step({"step": f.step + 1, "stage": self.stage.name, "skipped": True, "error": f.what + where})
        if self.stats["skipped"] > self.cfg.max_skipped:
            raise RolloutError(f"{self.stats['skipped']} rollouts failed (loop.max_skipped="
                               f"{self.cfg.max_skipped}); last at step {f.step}{where}: {f.what}") from f.error

    def _set_awake(self, awake: bool) -> float:
        """Seconds spent putting the generator to sleep or waking it (0 unless configured)."""
        if not self.cfg.sleep_while_training:
            return 0.0
        t = time.perf_counter()
        with self.gen_lock:
            self.generator.wake() if awake else self.generator.sleep()
        return time.perf_counter() - t

    def _sync(self, version: int) -> tuple[float, float]:
        """(seconds waiting for an in-flight generate call to finish, seconds moving the weights)."""
        t = time.perf_counter()
        with self.gen_lock, span("weight_sync"):
            t1 = time.perf_counter()
            self.sync_bytes = push_weights(self.learner, self.generator, version)
            t2 = time.perf_counter()
        with self.cond:
            self.cond.notify_all()
        return t1 - t, t2 - t1

    def _drain(self, producer: threading.Thread) -> None:
        while producer.is_alive():
            try:
                self.queue.get(timeout=0.1)  # unblock a producer stuck on a full queue
            except queue.Empty:
                pass
        producer.join()

    # ---- SIGINT / SIGTERM: finish the step, checkpoint, stop ----
    def _install_signal_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            return None

        def handler(signum, frame):
            with self.cond:
                self.stop_requested, self.stop_signal = True, signum
                self.cond.notify_all()
        return {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}

    @staticmethod
    def _restore_signal_handlers(old) -> None:
        for s, h in (old or {}).items():
            signal.signal(s, h)
