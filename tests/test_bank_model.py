"""Property test: random op sequences, forks, compactions and reopens agree with a plain Python model."""
import shutil
import tempfile

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bank_model import ModelBank, assert_same
from memr1.memory_store import Add, Delete, InvalidInput, MemoryBank, Noop, UnknownMemoryId, Update

DIM = 8
vectors = st.lists(st.floats(-1, 1, width=32), min_size=DIM, max_size=DIM).map(
    lambda xs: np.array(xs, np.float32)).filter(lambda v: np.abs(v).sum() > 1e-3)
texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=20)
turns = st.lists(st.sampled_from(["D1:1", "D1:2", "D2:1", "D3:7", "Dé:9"]), max_size=3).map(tuple)  # repeats too


class BankMachine(RuleBasedStateMachine):
    """banks[0] lives on disk; the others are forks in memory, each paired with its own model."""

    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp()
        self.banks = [MemoryBank.create(f"{self.dir}/bank", dim=DIM, hnsw_threshold=1_000_000)]
        self.models = [ModelBank()]
        self.queries = [np.random.default_rng(0).standard_normal(DIM).astype(np.float32) for _ in range(2)]

    def teardown(self):
        self.banks[0].close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(which=st.integers(0, 7), text=texts, vector=vectors, speaker=st.sampled_from(["A", "B"]), sources=turns)
    def add(self, which, text, vector, speaker, sources):
        j = which % len(self.banks)
        op = Add(text, vector, speaker, f"t{which}", sources)
        assert self.banks[j].apply(op) == self.models[j].apply(op)

    @rule(which=st.integers(0, 7), pick=st.integers(0, 1000), text=texts, vector=vectors,
          ts=st.none() | st.just("later"), sources=turns)
    def update(self, which, pick, text, vector, ts, sources):
        j = which % len(self.banks)
        ids = sorted(self.models[j].rows)
        target = ids[pick % len(ids)] if ids and pick % 3 else self.models[j].next_id + pick  # sometimes unknown
        op = Update(target, text, vector, ts, sources)
        if target in self.models[j].rows:
            self.banks[j].apply(op)
            self.models[j].apply(op)
        else:
            try:
                self.banks[j].apply(op)
                raise AssertionError("update of an unknown id was accepted")
            except UnknownMemoryId:
                pass

    @rule(which=st.integers(0, 7), pick=st.integers(0, 1000))
    def delete(self, which, pick):
        j = which % len(self.banks)
        ids = sorted(self.models[j].rows)
        if not ids:
            return
        op = Delete(ids[pick % len(ids)])
        self.banks[j].apply(op)
        self.models[j].apply(op)
        try:  # deleting twice is an unknown id
            self.banks[j].apply(op)
            raise AssertionError("second delete was accepted")
        except UnknownMemoryId:
            pass

    @rule(which=st.integers(0, 7))
    def noop(self, which):
        j = which % len(self.banks)
        self.banks[j].apply(Noop())
        self.models[j].apply(Noop())

    @precondition(lambda self: len(self.banks) < 6)
    @rule(which=st.integers(0, 7))
    def fork(self, which):
        j = which % len(self.banks)
        self.banks.append(self.banks[j].fork())
        self.models.append(self.models[j].fork())

    @rule(which=st.integers(0, 7))
    def compact(self, which):
        self.banks[which % len(self.banks)].compact()

    @rule()
    def reopen(self):
        self.banks[0].close()
        self.banks[0] = MemoryBank.open(f"{self.dir}/bank", "rw")

    @rule(which=st.integers(1, 7))
    def save_fork(self, which):
        if len(self.banks) < 2:
            return
        j = 1 + which % (len(self.banks) - 1)
        self.saves = getattr(self, "saves", 0) + 1
        saved = self.banks[j].save(f"{self.dir}/saved-{self.saves}")
        assert_same(saved, self.models[j], self.queries)
        saved.close()

    @rule(which=st.integers(0, 7), ops=st.lists(st.sampled_from(["add", "noop", "bad", "bad_sources"]), max_size=5),
          vector=vectors, sources=turns)
    def batch(self, which, ops, vector, sources):
        j = which % len(self.banks)
        batch = [Add("b", vector, "A", sources=sources) if o == "add" else Noop() if o == "noop"
                 else Add("b", vector, "A", sources=("D1:1", "")) if o == "bad_sources"
                 else Delete(self.models[j].next_id + 100) for o in ops]
        bad = next((o for o in ops if o.startswith("bad")), None)
        if bad:
            try:
                self.banks[j].apply_batch(batch)
                raise AssertionError(f"a batch with a {bad} op was accepted")
            except (UnknownMemoryId, InvalidInput):
                return  # nothing of it applied: the invariant checks that
        assert self.banks[j].apply_batch(batch) == [self.models[j].apply(op) for op in batch]

    @invariant()
    def agrees(self):
        for bank, model in zip(self.banks, self.models):
            assert_same(bank, model, self.queries)


TestBankMachine = BankMachine.TestCase
TestBankMachine.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
