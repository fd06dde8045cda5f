"""The bank side of bench.episodes: one LoGo-GRPO step's bank work, a script made once and replayed by
every impl. G episodes over S sessions from empty banks; a session is 5-7 manager calls, each a top-25
search of its speaker's memories and 1-2 ops (MIX, on live ids); every bank is snapshotted after every
session; per session, with probability 0.5, one episode's snapshot at k - 1 is re-run inner_n times,
each answering 16 questions (top-30 per speaker); each final bank answers 64. Vectors: 384-d, clustered.
MatrixBank (bench.matrix_bank): the numpy baseline's bank; `Side`: each impl's calls (memr1: fork; pickle: a
file per (episode, session), loaded per re-roll, as Memory-R2 does; deepcopy: in memory; cow_numpy:
CowBank, a shared frozen base and a per-bank overlay of appended rows and tombstones, the overlay copied
per snapshot and restore); `replay`: the timed step. `retain`: "step" keeps every snapshot to the
step's end (as Memory-R2 keeps its files), "window" drops those at k - 1 once session k's re-rolls are done."""
import copy
import itertools
import os
import pickle
import time
from dataclasses import dataclass, field

import numpy as np

from memr1.bench.matrix_bank import SPEAKERS, CowBank, MatrixBank
from memr1.bench.memory_impls import DIM, clustered, unit

MIX = {"add": 0.75, "update": 0.15, "delete": 0.05, "none": 0.05}
IMPLS = ("memr1", "pickle_snapshots", "deepcopy", "cow_numpy")


@dataclass
class Shape:
    group: int
    sessions: int
    inner_n: int
    calls: int = 6                 # manager calls per session on average (calls - 1 .. calls + 1)
    k_call: int = 25               # a call's search: top-k of its speaker's memories
    k_question: int = 30           # a question's search: top-k per speaker, both speakers
    local_questions: int = 16
    global_questions: int = 64
    reroll_prob: float = 0.5
    seed: int = 0


@dataclass
class Script:
    """A call is (speaker, query row, ops); an op is (kind, id, vector row): for an ADD the id the bank
    must assign, -1 where there is none. `rerolls[k]` = (episode, inner_n sessions of calls, question rows)."""
    shape: Shape
    vecs: np.ndarray
    sessions: list = field(default_factory=list)      # [episode][session] -> calls
    rerolls: dict = field(default_factory=dict)
    final_q: list = field(default_factory=list)


def make_script(shape: Shape) -> Script:
    """The step, seeded: ids follow each bank's own counter, so every impl must assign the same ones."""
    rng = np.random.default_rng(shape.seed)
    kinds, p = list(MIX), list(MIX.values())
    rows = itertools.count()
    new_row = rows.__next__

    def session(state) -> list:
        next_id, live = state
        calls = []
        for _ in range(int(rng.integers(max(1, shape.calls - 1), shape.calls + 2))):
            s, q, ops = int(rng.integers(len(SPEAKERS))), new_row(), []
            for kind in rng.choice(kinds, size=int(rng.integers(1, 3)), p=p):
                kind = "add" if kind in ("update", "delete") and not live[s] else str(kind)
                if kind == "add":
                    ops.append(("add", next_id, new_row()))
                    live[s].append(next_id)
                    next_id += 1
                elif kind == "update":
                    ops.append(("update", live[s][int(rng.integers(len(live[s])))], new_row()))
                elif kind == "delete":
                    ops.append(("delete", live[s].pop(int(rng.integers(len(live[s])))), -1))
                else:
                    ops.append(("none", -1, -1))
            calls.append((s, q, tuple(ops)))
        state[0] = next_id
        return calls

    empty = lambda: [0, [[] for _ in SPEAKERS]]  # noqa: E731  [next id, live ids per speaker]
    script = Script(shape, np.empty(0))
    states = []   # [episode][session] -> the state after it
    for _ in range(shape.group):
        state, mine, after = empty(), [], []
        for _ in range(shape.sessions):
            mine.append(session(state))
            after.append(copy.deepcopy(state))
        script.sessions.append(mine)
        states.append(after)
    for k in range(shape.sessions):
        if rng.random() < shape.reroll_prob:
            e = int(rng.integers(shape.group))
            group = [session(copy.deepcopy(states[e][k - 1]) if k else empty()) for _ in range(shape.inner_n)]
            script.rerolls[k] = (e, group, [new_row() for _ in range(shape.local_questions)])
    script.final_q = [new_row() for _ in range(shape.global_questions)]
    script.vecs = unit(clustered(next(rows), seed=shape.seed + 101)).astype(np.float32)
    return script


def text_of(row: int, speaker: str) -> str:
    return f"{speaker} mentioned fact #{row} about topic {row % 97} on a weekday"


class Side:
    """One impl's bank calls: new, op (its own op object), search, snapshot, restore (a re-roll's bank)
    and release (a snapshot's end); `bytes` counts what pickle wrote."""

    def __init__(self, name: str, tmp: str | None = None):
        self.name, self.dir, self.bytes = name, tmp, 0
        self.search = lambda bank, q, k, speaker: bank.search(q, k, speaker)
        self.release = os.unlink if name == "pickle_snapshots" else (lambda snap: None)
        if name == "memr1":
            from memr1.memory_store import Add, Delete, MemoryBank, Noop, Update
            ops = {"add": lambda mid, v, t, s: Add(t, v, s, ""), "update": lambda mid, v, t, s: Update(mid, t, v),
                   "delete": lambda mid, v, t, s: Delete(mid), "none": lambda mid, v, t, s: Noop()}
            self.new = lambda: MemoryBank.create(None, dim=DIM)
            self.op = lambda kind, mid, vec, text, speaker: ops[kind](mid, vec, text, speaker)
            self.snapshot, self.restore = (lambda bank, key: bank.fork()), (lambda snap: snap.fork())
        elif name in ("deepcopy", "pickle_snapshots"):
            self.new, self.op = MatrixBank, (lambda *op: op)
            self.snapshot, self.restore = ((lambda bank, key: copy.deepcopy(bank)), copy.deepcopy) \
                if name == "deepcopy" else (self._dump, self._load)
        elif name == "cow_numpy":
            self.new, self.op = CowBank, (lambda *op: op)
            self.snapshot, self.restore = (lambda bank, key: bank.snapshot()), (lambda snap: snap.copy())
        else:
            raise ValueError(f"unknown impl {name!r} (one of {', '.join(IMPLS)})")

    def _dump(self, bank, key) -> str:
        path = os.path.join(self.dir, f"e{key[0]}-s{key[1]}.pkl")
        with open(path, "wb") as f:
            pickle.dump(bank, f, protocol=pickle.HIGHEST_PROTOCOL)
            self.bytes += f.tell()
        return path

    @staticmethod
    def _load(path: str):
        with open(path, "rb") as f:
            return pickle.load(f)


def prepare(script: Script, side) -> tuple:
    """The script as `side`'s own op objects (outside any timer): calls are (speaker, query, ops), an op
    (side's op, kind, the id the script expects)."""
    vecs = script.vecs

    def conv(calls):
        return [(SPEAKERS[s], vecs[q], [(side.op(kind, mid, vecs[r] if r >= 0 else None, text_of(r, SPEAKERS[s]),
                                                 SPEAKERS[s]), kind, mid) for kind, mid, r in ops])
                for s, q, ops in calls]
    return ([[conv(c) for c in ep] for ep in script.sessions],
            {k: (e, [conv(c) for c in group], [vecs[q] for q in qs]) for k, (e, group, qs) in script.rerolls.items()},
            [vecs[q] for q in script.final_q])


def replay(shape: Shape, prepared: tuple, side, retain: str = "step", record=None) -> dict:
    """One step on `side`, timed by part (`wall_s` is the whole step). `record`: indices of the searches
    whose (ids, scores) come back in `found`; every ADD's id is then checked against the script. The
    work is counted after the timer stops, so the step times only the bank's calls."""
    sessions, rerolls, final_q = prepared
    clock, search, checking = time.perf_counter, side.search, record is not None
    t = {"snapshot_s": 0.0, "search_s": 0.0, "op_s": 0.0}
    n = {"n_snapshots": 0, "n_restores": 0, "snapshots_held_max": 0}
    ran, asked, found, seen = [], [], {}, itertools.count()   # call and question lists replayed; records

    def keep(hit):   # the step's i-th search, recorded if `record` holds i
        if (i := next(seen)) in record:
            found[i] = (np.asarray(hit[0]).tolist(), np.asarray(hit[1], np.float64).tolist())

    def run_calls(bank, calls):
        ran.append(calls)
        for speaker, q, ops in calls:
            t0 = clock()
            hit = search(bank, q, shape.k_call, speaker)
            t1 = clock()
            for o, kind, mid in ops:
                got = bank.apply(o)
                if checking and kind == "add" and got != mid:
                    raise RuntimeError(f"{side.name}: an ADD got id {got}, the script expects {mid}")
            t["search_s"] += t1 - t0
            t["op_s"] += clock() - t1
            if checking:
                keep(hit)

    def ask(bank, questions):
        asked.append(questions)
        for q in questions:
            for speaker in SPEAKERS:
                t0 = clock()
                hit = search(bank, q, shape.k_question, speaker)
                t["search_s"] += clock() - t0
                if checking:
                    keep(hit)

    start = clock()
    banks, snaps = [side.new() for _ in range(shape.group)], {}
    for k in range(shape.sessions):
        for e, bank in enumerate(banks):
            run_calls(bank, sessions[e][k])
        t0 = clock()
        for e, bank in enumerate(banks):
            snaps[e, k] = side.snapshot(bank, (e, k))
        t["snapshot_s"] += clock() - t0
        n["n_snapshots"] += shape.group
        n["snapshots_held_max"] = max(n["snapshots_held_max"], len(snaps))
        if k in rerolls:
            e, group, questions = rerolls[k]
            for calls in group:
                t0 = clock()
                bank = side.restore(snaps[e, k - 1]) if k else side.new()
                t["snapshot_s"] += clock() - t0
                n["n_restores"] += 1
                run_calls(bank, calls)
                ask(bank, questions)
                t0 = clock()
                bank = None   # the re-run is done with: dropped
                t["snapshot_s"] += clock() - t0
        if retain == "window" and k:
            t0 = clock()
            for e in range(shape.group):
                side.release(snaps.pop((e, k - 1)))
            t["snapshot_s"] += clock() - t0
    for bank in banks:
        ask(bank, final_q)
    rows_final = float(np.mean([len(b) for b in banks]))
    t0 = clock()
    for snap in snaps.values():
        side.release(snap)
    snaps.clear()
    banks.clear()
    bank = None
    t["snapshot_s"] += clock() - t0
    wall = clock() - start
    calls = [c for run in ran for c in run]
    n.update(n_searches=len(calls) + len(SPEAKERS) * sum(map(len, asked)), n_ops=sum(len(c[2]) for c in calls),
             rows_written=sum(kind in ("add", "update") for c in calls for _, kind, _ in c[2]))
    return {"wall_s": wall, **t, **n, "bank_rows_final": rows_final, "snapshot_bytes": side.bytes, "found": found}
