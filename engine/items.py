"""The items each stage of a run trains on (rl/task/train_items.py), with the banks and facts they need.

Facts come from `rl.task.facts.facts_for` (the synthetic oracle's, or extraction by the base model, cached
with the eval's extraction cache key: config/caches.py). Banks are the synthetic oracle's, or built by a
manager checkpoint through `rl.task.banks.run_manager`, cached in the run:
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
from memr1.rl.task.banks import run_manager, safe_name
from memr1.rl.task.data import load_configured, load_conversations
from memr1.rl.task.facts import facts_for, oracle_facts
from memr1.rl.task.train_items import (CallStats, answer_items, dead_items, history_conversation, manager_calls, manager_items,
                            mixed_answer_items, oracle_bank, oracle_banks, step_items)
from memr1.rl.task.rag import fact_bank
from memr1.rl.task.turns import manager_turns

FORMAT_POOL_CONVERSATIONS = 10   # of the format pool's synthetic set: its 8 train conversations hold
                                 # hundreds of calls and questions, far more than a format start's cap


def call_key(item) -> tuple[str, str]:
    """A manager item's call: its conversation and first turn (a call split into items shares its bank)."""
    return item.conversation, item.call["dia_ids"][0]


class RunItems:
    """Builds, once each, the items a run's stages need. `swap` is the run's weight-swapping engine."""

    def __init__(self, run, embedder, swap, split: str = "train"):
        self.run, self.cfg, self.embedder, self.swap, self.split = run, run.cfg, embedder, swap, split
        self.convs = load_configured(self.cfg.data, split)
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
        """Episode items (rl/task/episodes.py) over the first `sessions` sessions of each conversation."""
        from memr1.rl.task.episodes import episode_items

        if ("episodes", sessions) not in self._memo:
            self._memo["episodes", sessions] = episode_items(self.convs, self.facts(), self.cfg.manager.turns_per_call,
                                                             sessions)
            if not self._memo["episodes", sessions]:
                raise ValueError(f"no {self.split} conversation has a question decided in its first {sessions} "
                                 f"sessions: no episode items")
        return self._memo["episodes", sessions]

    def manager(self, stage: str, bank_manager: Path | None = None, probe: bool = False) -> list:
        """Manager items, on each call's bank (module doc): the calls whose ops can change a question's
        answer (those answers are the reward); a warm start imitates the oracle on every call.
        `bank_manager` builds the "manager" pipeline's banks (None: the base model); `probe`: the items
        held out of training for the probe curve (`carve`)."""
        return self.carve(self._manager(stage, bank_manager)[0], stage)[probe]

    def manager_stats(self, stage: str, bank_manager: Path | None = None) -> dict:
        """{"items", "calls", "questions", "unreachable_questions", "guard_questions", "dead_items"} of
        the stage's manager items, which the stage logs at its start."""
        return self._manager(stage, bank_manager)[1]

    def _manager(self, stage: str, bank_manager: Path | None) -> tuple[list, dict]:
        warm = stage_name(stage).kind == "warm"
        pipeline = "oracle" if warm else self.cfg.items.bank_pipeline
        manager = Path(bank_manager or self.run.base_model)
        key = ("manager", pipeline, warm, str(manager) if pipeline == "manager" else "")
        if key not in self._memo:
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
                items = manager_items(specs, banks, self.cfg.items, self.run.seed, shown, keep_empty=warm)
            else:   # the items first (they need no bank), then the banks of those a stage draws
                items = manager_items(specs, [None] * len(specs), self.cfg.items, self.run.seed)
                banks = self.history_banks(specs, items, stage, manager)
                for it in items:
                    it.bank = banks[call_key(it)]
            self._memo[key] = items, {
                "items": len(items), "calls": len({id(it.call) for it in items}), "questions": stats.questions,
                "unreachable_questions": stats.unreachable,
                "guard_questions": sum(len(it.guards) for it in items),
                "dead_items": 0 if warm else dead_items(items, {c.sample_id: c.oracle for c in self.convs})}
        return self._memo[key]

    def history_banks(self, specs: list, items: list, stage: str, manager: Path) -> dict:
        """The paper's stage-1 banks: `manager` (the base model in the paper) over each call's preceding
        window of turns, for the calls the stage draws; call id -> bank."""
        drawn = {call_key(it) for it in self.wanted(items, stage)}
        histories = {(s.conv.sample_id, s.call["dia_ids"][0]): history_conversation(
            s, self.facts()[s.conv.sample_id], self.cfg.items.window_turns) for s in specs}
        convs = [h for k, (h, _) in histories.items() if k in drawn]
        facts = {h.sample_id: f for h, f in histories.values()}
        builds = self.build(convs, facts, manager, self.run.run_dir / "manager" / "items", "history banks")
        stand_in = MemoryBank.create(None, dim=self.embedder.dim)  # another rank's item: never drawn here
        return {k: builds[h.sample_id].bank if h.sample_id in builds else stand_in for k, (h, _) in histories.items()}

    def answer(self, stage: str, manager: Path | None, probe: bool = False) -> list:
        """Answer items on the banks `items.answer_banks` names (warm starts: `stage.answer_warm.banks`): the oracle's,
        banks built by `manager` (the run's latest), or the oracle's and ADD-every-fact banks alternately;
        `probe`: the items held out of training for the probe curve (`carve`)."""
        source = self.cfg.stage.answer_warm.banks if stage_name(stage).kind == "warm" else self.cfg.items.answer_banks
        key = ("answer", str(manager) if source == "manager" else source)
        if key not in self._memo:
            oracle = lambda: {c.sample_id: oracle_bank(None, c, self.embedder) for c in self.convs}
            if source == "oracle":
                items = answer_items(self.convs, oracle(), self.run.seed)
            elif source == "mix":
                facts = self.facts()
                add_all = {c.sample_id: fact_bank(c.turns(), facts[c.sample_id], self.embedder) for c in self.convs}
                items = mixed_answer_items(self.convs, oracle(), add_all, self.run.seed)
            else:
                items = answer_items(self.convs, {c.sample_id: None for c in self.convs}, self.run.seed)
                needed = {it.conversation for it in self.wanted(items, stage)}
                convs = [c for c in self.convs if c.sample_id in needed]
                builds = self.build(convs, self.facts(), manager, self.run.run_dir / "answer" / "banks", "answer banks")
                stand_in = MemoryBank.create(None, dim=self.embedder.dim)  # another rank's: never drawn here
                items = answer_items(self.convs, {c.sample_id: builds[c.sample_id].bank if c.sample_id in builds
                                                  else stand_in for c in self.convs}, self.run.seed)
            self._memo[key] = items
        return self.carve(self._memo[key], stage)[probe]

    def format_pool(self, role: str, pool_seed: int | None, examples: int) -> tuple[list, dict]:
        """A format start's items (`WarmConfig`): at most `examples` warm items of the built-in set of the
        run's kind and `pool_seed` (None: the run's own train split), on the oracle's banks with the oracle's facts,
        and the conversations they come from."""
        if pool_seed is None:
            its, convs = (self.manager(f"{role}_warm") if role == "manager" else self.answer(f"{role}_warm", None)), \
                self.by_id
            return its[:examples or None], convs
        if not self.cfg.data.path and pool_seed == getattr(self.cfg.data, "seed", 0):
            raise ValueError(f"stage.{role}_warm.pool_seed = {pool_seed} is the data set's own seed (data.seed): "
                             f"the format pool must be disjoint from train, val and test; pick another seed")
        convs = load_conversations(None, FORMAT_POOL_CONVERSATIONS, pool_seed, split="train", kind=self.cfg.data.kind)
        if role == "manager":
            specs = manager_calls(convs, {c.sample_id: oracle_facts(c) for c in convs},
                                  self.run.task.manager.turns_per_call, every_call=True)
            its = manager_items(specs, oracle_banks(specs, self.embedder), self.cfg.items, self.run.seed)
        else:
            its = answer_items(convs, {c.sample_id: oracle_bank(None, c, self.embedder) for c in convs}, self.run.seed)
        return its[:examples or None], {c.sample_id: c for c in convs}

    def carve(self, items: list, stage: str) -> tuple[list, list]:
        """(training items, probe items): with `loop.probe_every`, the last `loop.probe_items` of an RL
        stage's train items (at most a quarter of them, so small data still trains) are held out of
        training and scored greedily every few steps (the probe curve); warm starts and other splits
        keep every item."""
        k = min(self.cfg.loop.probe_items, len(items) // 4) if self.cfg.loop.probe_every and self.split == "train" \
            else 0
        if not k or stage_name(stage).kind in ("warm", "episode"):
            return items, []
        return items[:-k], items[-k:]

    def wanted(self, items: list, stage: str) -> list:
        """The items whose banks this rank must build: those its share of `stage`'s training steps draws
        (the draw is fixed by step, so a resume builds the same set) and the probe items; validation
        draws every item."""
        if self.split != "train":
            return items
        train, probe = self.carve(items, stage)
        s = self.run.stage(stage)
        return [it for step in range(s.steps)
                for it in step_items(train, step, s.prompts_per_step, self.run.rank, self.run.world)] + probe

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
