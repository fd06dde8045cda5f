"""The items each stage of a run trains on (rl/items.py), with the banks and facts they need.

Facts come from `rl.facts.facts_for` (the synthetic oracle's, or extraction by the base model, cached
with the eval's extraction cache key: config/caches.py). Banks are the synthetic oracle's, or built by a
manager checkpoint through `rl.banks.run_manager`, cached in the run:
    <run>/manager/items/<bank key>/     stage-1 items' banks (the base manager over each call's history)
    <run>/answer/banks/<bank key>/      the answer stage's banks (the run's latest manager)
Under data parallelism each rank builds the banks its own items need, in its own `rank<r>` folder
(a bank has one writer). Warm stages always use the oracle's banks: their targets copy oracle memories.
"""
from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from memr1.engine.config.caches import cache_dirs, cache_keys, model_identity
from memr1.engine.config.stages import stage_name
from memr1.memory_store import MemoryBank
from memr1.rl.banks import run_manager, safe_name
from memr1.rl.facts import facts_for
from memr1.rl.data import load_conversations
from memr1.rl.items import (CallStats, answer_items, dead_items, history_conversation, manager_calls, manager_items,
                            oracle_bank, oracle_banks, step_items)
from memr1.rl.turns import manager_turns


class RunItems:
    """Builds, once each, the items a run's stages need. `swap` is the run's weight-swapping engine."""

    def __init__(self, run, embedder, swap, split: str = "train"):
        self.run, self.cfg, self.embedder, self.swap, self.split = run, run.cfg, embedder, swap, split
        self.convs = load_conversations(self.cfg.data.path or None, self.cfg.data.n, split=split)
        self.by_id = {c.sample_id: c for c in self.convs}
        self._facts = None
        self._memo: dict = {}
        self._builds: list = []   # durable banks this run opened (each holds its writer lock until closed)

    def close(self) -> None:
        for b in self._builds:
            b.bank.close()
        self._builds.clear()

    def bar(self, desc: str):
        return tqdm(desc=desc, total=0, unit="prompt", dynamic_ncols=True, disable=self.run.rank != 0)

    def facts(self) -> dict:
        if self._facts is None:
            cfg, base = self.cfg, self.run.base_model
            facts_dir, _ = cache_dirs(cfg, {"extract": model_identity(base), "manager": ""})
            with self.bar(f"{self.split} items: extract") as b:
                self._facts = facts_for(self.convs, self.swap.view(base), self.run.task.extract,
                                        {c.sample_id: facts_dir / safe_name(c.sample_id) for c in self.convs},
                                        cfg.generator.batch_size, 0, b)
        return self._facts

    def episodes(self, sessions: int) -> list:
        """Episode items (rl/episodes.py) over the first `sessions` sessions of each conversation."""
        from memr1.rl.episodes import episode_items

        if ("episodes", sessions) not in self._memo:
            self._memo["episodes", sessions] = episode_items(self.convs, self.facts(), self.cfg.manager.turns_per_call,
                                                             sessions)
            if not self._memo["episodes", sessions]:
                raise ValueError(f"no {self.split} conversation has a question decided in its first {sessions} "
                                 f"sessions: no episode items")
        return self._memo["episodes", sessions]

    def manager(self, stage: str) -> list:
        """Manager items, on each call's bank (module doc): the calls whose ops can change a question's
        answer (those answers are the reward); a warm start imitates the oracle on every call."""
        return self._manager(stage)[0]

    def manager_stats(self, stage: str) -> dict:
        """{"items", "calls", "questions", "unreachable_questions", "guard_questions", "dead_items"} of
        the stage's manager items, which the stage logs at its start."""
        return self._manager(stage)[1]

    def _manager(self, stage: str) -> tuple[list, dict]:
        warm = stage_name(stage).kind == "warm"
        pipeline = "oracle" if warm else self.cfg.items.bank_pipeline
        if ("manager", pipeline, warm) not in self._memo:
            stats = CallStats()
            guards = not warm and pipeline == "oracle" and self.cfg.items.guard_questions > 0
            specs = manager_calls(self.convs, self.facts(), self.run.task.manager.turns_per_call,
                                  every_call=warm or guards, stats=stats)
            shown = None
            if pipeline == "oracle":
                banks = oracle_banks(specs, self.embedder)
                if guards:   # what each prompt shows picks the guard questions
                    turns = manager_turns([(b, s.call)
                                           for s, b in zip(specs, banks)], self.embedder, self.run.task.manager)
                    shown = [[b.get(i).text for i in t.prompt.bank_ids] for t, b in zip(turns, banks)]
            else:
                banks = self.history_banks(specs, stage)
            items = manager_items(specs, banks, self.cfg.items, self.run.seed, shown, keep_empty=warm)
            self._memo["manager", pipeline, warm] = items, {
                "items": len(items), "calls": len({id(it.call) for it in items}), "questions": stats.questions,
                "unreachable_questions": stats.unreachable,
                "guard_questions": sum(len(it.guards) for it in items),
                "dead_items": 0 if warm else dead_items(items, {c.sample_id: c.oracle for c in self.convs})}
        return self._memo["manager", pipeline, warm]

    def history_banks(self, specs: list, stage: str) -> list:
        """The paper's stage-1 banks: the base manager over each call's preceding window of turns."""
        needed = self.needed(specs, stage, key=lambda s: s.conv.sample_id + "@" + s.call["dia_ids"][0])
        histories = [history_conversation(s, self.facts()[s.conv.sample_id], self.cfg.items.window_turns)
                     for s in specs]
        convs = [h for h, _ in histories if h.sample_id in needed]
        facts = {h.sample_id: f for h, f in histories}
        builds = self.build(convs, facts, self.run.base_model, self.run.run_dir / "manager" / "items", "history banks")
        stand_in = MemoryBank.create(None, dim=self.embedder.dim)  # another rank's item: never drawn here
        return [builds[h.sample_id].bank if h.sample_id in builds else stand_in for h, _ in histories]

    def answer(self, stage: str, manager: Path | None) -> list:
        """Answer items on the oracle's banks, or on banks built by `manager` (the run's latest)."""
        oracle = stage_name(stage).kind == "warm" or self.cfg.items.answer_banks == "oracle"
        key = ("answer", "oracle" if oracle else str(manager))
        if key not in self._memo:
            if oracle:
                banks = {c.sample_id: oracle_bank(None, c, self.embedder) for c in self.convs}
            else:
                items = answer_items(self.convs, {c.sample_id: None for c in self.convs}, self.run.seed)
                needed = self.needed(items, stage, key=lambda it: it.conversation)
                convs = [c for c in self.convs if c.sample_id in needed]
                builds = self.build(convs, self.facts(), manager, self.run.run_dir / "answer" / "banks", "answer banks")
                stand_in = MemoryBank.create(None, dim=self.embedder.dim)  # another rank's: never drawn here
                banks = {c.sample_id: builds[c.sample_id].bank if c.sample_id in builds else stand_in
                         for c in self.convs}
            self._memo[key] = answer_items(self.convs, banks, self.run.seed)
        return self._memo[key]

    def needed(self, items: list, stage: str, key) -> set:
        """What this rank's share of `stage`'s steps will draw (the draw is fixed by step, so a resume
        builds the same set); validation draws every item."""
        if self.split != "train":
            return {key(it) for it in items}
        s = self.run.stage(stage)
        return {key(it) for step in range(s.steps)
                for it in step_items(items, step, s.prompts_per_step, self.run.rank, self.run.world)}

    def build(self, convs: list, facts: dict, manager: Path, root: Path, what: str) -> dict:
        cfg = self.cfg
        ids = {"extract": model_identity(self.run.base_model), "manager": model_identity(Path(manager))}
        folder = root / cache_keys(cfg, ids)[1]
        if self.run.world > 1:
            folder = folder / f"rank{self.run.rank}"
        with self.bar(f"{what}: manager") as b:
            builds = run_manager(convs, {c.sample_id: folder / safe_name(c.sample_id) for c in convs}, facts,
                                 self.swap.view(Path(manager)), self.embedder, self.run.task.manager,
                                 batch_size=cfg.generator.batch_size, bank_overrides={"fsync": cfg.bank.fsync}, bar=b)
        self._builds += builds.values()
        if self.run.rank == 0:
            print(f"{what}: {len(builds)} banks by {manager}, {sum(len(b.bank) for b in builds.values())} memories, "
                  f"in {folder}")
        return builds
