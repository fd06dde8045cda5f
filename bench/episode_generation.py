"""The `memr1_with_generation` row of bench.episodes: one EpisodeStage.rollout step (G=4, S=2,
inner_n=2) on SmolLM2-135M with configs/default.toml's generator, embedder, manager and answer
settings, synthetic data, the same engine as frozen answerer; the shares of the step's wall time in
generate calls, MemoryBank calls (its methods wrapped) and embedding. Run in a child process by
bench.episodes --generation.
"""
import json
import sys
import time
from pathlib import Path

from memr1.bench.common import status_mb
from memr1.rl.task.stages.context import StageContext

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "default.toml"

METRICS = ("sessions", "gen_s", "score_s", "episodes", "forks", "bank_ops", "completions", "response_tokens",
           "final_memories", "parse_failure_rate")


def generation_problem() -> str | None:
    """Why the generation row cannot run on rl/task/stages/episode.py as it is now (None: it can), checked
    before the grid so that a changed API costs a line, not a run."""
    import inspect
    try:
        from memr1.rl.task.stages.episode import EpisodeStage
        from memr1.rl.task.episodes import EpisodeConfig
        inspect.signature(EpisodeStage).bind(*range(5))
        inspect.signature(EpisodeStage.rollout).bind(None, 0, None)
        missing = {"sessions", "inner_n", "curriculum"} - set(EpisodeConfig.__struct_fields__)
        return f"EpisodeConfig has no {sorted(missing)}" if missing else None
    except (ImportError, TypeError, AttributeError) as e:
        return f"{type(e).__name__}: {e}"


def generation_error(problem: str) -> str:
    return ("error: --generation needs memr1.rl.task.stages.episode.EpisodeStage(items_for, frozen_answer, ctx, "
            "cfg, episode) with .frozen, .ctx.embedder, .cfg.group_size, "
            f".episode.inner_n and .rollout(step, generator).metrics holding {', '.join(METRICS)}; {problem}")


class Clock:
    """Seconds inside wrapped calls; a wrapped call inside another (items_for_prompt's search) counts once."""
    def __init__(self):
        self.s, self.calls, self._depth = 0.0, 0, 0

    def wrap(self, fn):
        def timed(*a, **kw):
            if self._depth:
                return fn(*a, **kw)
            self._depth, t = 1, time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.s, self.calls, self._depth = self.s + time.perf_counter() - t, self.calls + 1, 0
        return timed


class TimedGenerator:
    """A generator whose generate calls `clock` times; everything else passes through."""
    def __init__(self, gen, clock: Clock):
        self.gen, self.generate = gen, clock.wrap(gen.generate)

    def __getattr__(self, name):
        return getattr(self.gen, name)


BANK_CALLS = ("apply", "apply_batch", "search", "fork", "get", "items_for_prompt", "__len__", "__contains__",
              "__iter__")


def timed_rollout(stage, policy) -> dict:
    """One EpisodeStage.rollout (step 0), its generate calls (policy and frozen answerer), MemoryBank
    calls and embedding timed apart; the class and objects are restored after."""
    from memr1.memory_store import MemoryBank
    gen, bank, emb = Clock(), Clock(), Clock()
    saved, frozen, embedder = {n: MemoryBank.__dict__[n] for n in BANK_CALLS}, stage.frozen, stage.ctx.embedder
    for n, f in saved.items():   # __iter__ lists its memories inside the timer
        setattr(MemoryBank, n, bank.wrap(f if n != "__iter__" else lambda self, f=f: iter(list(f(self)))))
    stage.frozen, embedder.embed = TimedGenerator(frozen, gen), emb.wrap(embedder.embed)
    try:
        t = time.perf_counter()
        m = stage.rollout(0, TimedGenerator(policy, gen)).metrics
        wall = time.perf_counter() - t
    finally:
        for n, f in saved.items():
            setattr(MemoryBank, n, f)
        stage.frozen = frozen
        vars(embedder).pop("embed")
    if missing := [k for k in METRICS if k not in m]:
        raise LookupError(f"its metrics lack {missing}")
    return {"impl": "memr1_with_generation", "sessions": m["sessions"], "group": stage.cfg.group_size,
            "inner_n": stage.episode.inner_n, "episodes_per_s": m["episodes"] / wall, "step_s": wall,
            "gen_s": gen.s, "manager_gen_s": m["gen_s"], "score_s": m["score_s"], "bank_s": bank.s,
            "embed_s": emb.s, "gen_share": gen.s / wall, "bank_share": bank.s / wall, "embed_share": emb.s / wall,
            "other_share": 1 - (gen.s + bank.s + emb.s) / wall, "generate_calls": gen.calls, "bank_calls": bank.calls,
            **{k: m[k] for k in METRICS[3:]}}


def generation_child(out: str, group: int = 4, sessions: int = 2, inner_n: int = 2) -> int:
    import msgspec

    from memr1.engine.config.resolve import resolve
    from memr1.engine.config.run import load_config, make_embedder
    from memr1.engine.generation import make_generator
    from memr1.rl.task.data import load_configured
    from memr1.rl.task.stages.episode import EpisodeStage
    from memr1.rl.task.episodes import episode_items
    from memr1.rl.task.facts import facts_for
    from memr1.rl.generation import GREEDY
    from memr1.rl.task.stages.calls import StageConfig

    run = resolve(load_config(DEFAULT_CONFIG))
    cfg = run.cfg
    convs = load_configured(cfg.data, "train")
    items = episode_items(convs, facts_for(convs, None, run.task.extract, None), cfg.manager.turns_per_call, sessions)
    gen = make_generator(cfg.generator, run.seed)
    gen.generate([[{"role": "user", "content": "Hello"}]], 1, GREEDY.with_tokens(4))  # warm-up, untimed
    episode = msgspec.structs.replace(cfg.episode, sessions=sessions, inner_n=inner_n, curriculum=[])
    ctx = StageContext(make_embedder(cfg), run.task, cfg.reward, run.rollout_sampling("manager"), seed=run.seed)
    stage = EpisodeStage(lambda s: items, gen, ctx, StageConfig(steps=1, prompts_per_step=1, group_size=group),
                         episode)
    try:
        row = timed_rollout(stage, gen)
    except LookupError as e:   # renamed metrics: the one change generation_problem cannot see before a step
        print(generation_error(str(e)), file=sys.stderr)
        return 2
    row.update(peak_rss_mb=status_mb("VmHWM"), backend=type(gen).__name__, generator=msgspec.to_builtins(cfg.generator),
               manager_top_k=cfg.manager.top_k, answer_top_k=cfg.answer.top_k_per_speaker, config=str(DEFAULT_CONFIG))
    Path(out).write_text(json.dumps(row))
    return 0
