"""What memr1's O(1) forks buy in session-level rollouts (Memory-R2's LoGo-GRPO, rl/task/episodes.py).

    python -m memr1.bench.episodes [--quick] [--generation] --json PATH

Bank side, generation excluded: one step's bank work (bench.episode_workload: the workload and the
impls) replayed from a script made once per S, the same for every impl: `memr1` (forks),
`pickle_snapshots` (a file per (episode, session), as Memory-R2 does), `deepcopy`, both on the numpy
bank a competent user writes, at its best, and `cow_numpy`, what that user writes next: a shared frozen
base (vectors, ids, texts, never copied) and a per-bank overlay of appended rows and tombstones, copied
per snapshot and restore and folded into a new base by a snapshot once large (bench.matrix_bank.CowBank).
All on one BLAS thread (OPENBLAS/OMP/MKL_NUM_THREADS=1 unless set) as memr1 searches on one.
Before timing, every impl replays the script with searches recorded: top-k ids must agree (or swap
only within a float32 near-tie, 1e-5: `agreement`), else the bench stops. A round is one fresh process
per impl, in an order that alternates round by round: after setup and a small warm-up, one full step
gives the memory (VmHWM reset before it; rss_growth_mb = peak - post-setup RSS) and first_step_s, then
`--steps` more give the time (their median: a trainer's steady state). Rows carry medians over rounds
and step_s's spread. bytes_per_snapshot: pickle's mean file size; in memory, rss_growth over the most
snapshots held at once (live banks count too). `--retain window` drops snapshots at k - 1 after
session k. The headline, per S, memr1 over each baseline: the snapshot cost (snapshot_s: snapshot,
restore and drop; target >= 2x the copy-on-write bank at S = 32), each side's share of its floor (one
empty Python method call per snapshot, restore and release, timed in the same child), and beside it
the whole step's ratio with its ceiling if memr1's snapshots cost nothing (`free_snapshot_ratio`:
both sides search and write alike, so forks cannot lift the step past it); and RSS growth per row
written (target: memr1's <= the copy-on-write bank's at S = 32). memr1's fork copies nothing: its trie
copies a node on the first write to it after a fork, which op_s times; the CoW bank's copies are all in
snapshot_s.
--quick: S = 8, 16, 32 at G = 4, inner_n = 4; 3 rounds of 2 timed steps.
`--generation` adds `memr1_with_generation` (bench.episode_generation): one EpisodeStage step on
SmolLM2-135M and the shares of its wall time in generation, MemoryBank calls and embedding, and (headline
"with generation: ...") the share of that step snapshots would take with memr1 and with each baseline.
"""
import argparse
import gc
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from memr1.bench.common import headline_entry, print_table, status_mb, write_json
from memr1.bench.episode_generation import generation_child, generation_error, generation_problem
from memr1.bench.episode_workload import IMPLS, MIX, Shape, Side, make_script, prepare, replay
from memr1.bench.matrix_bank import CowBank
from memr1.bench.memory_impls import DIM

TOL = 1e-5
THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
PAGE_MB = 4 / 1024   # RSS moves in pages: a growth below one says nothing
TIMED = ("wall_s", "snapshot_s", "search_s", "op_s")


# ---- agreement, before any timing ----
def compare(a_ids, a_sc, b_ids, b_sc) -> str:
    """"same", "tie" (ids swapped only where scores tie within TOL) or "differ"."""
    if a_ids == b_ids:
        return "same"
    if len(a_ids) != len(b_ids):
        return "differ"
    pos = {x: j for j, x in enumerate(b_ids)}
    for i, (x, y) in enumerate(zip(a_ids, b_ids)):
        if x != y and (abs(a_sc[i] - (b_sc[pos[x]] if x in pos else b_sc[-1])) > TOL or abs(a_sc[i] - b_sc[i]) > TOL):
            return "differ"
    return "tie"


def agreement(script, tmp: str, sample: int) -> dict:
    """Every impl replays the script (every ADD's id checked too); `sample` of its searches, evenly
    spaced, are compared with memr1's; one that differs stops the bench before anything is timed."""
    sh = script.shape
    total = sum(len(c) for ep in script.sessions for c in ep) + sh.group * len(script.final_q) * 2 + \
        sum(len(c) + 2 * len(qs) for _, group, qs in script.rerolls.values() for c in group)
    stride = max(1, total // sample)
    found = {}
    for impl in IMPLS:
        side = Side(impl, tmp)
        found[impl] = replay(sh, prepare(script, side), side, record=range(0, total, stride))["found"]
    ref, out = found["memr1"], {"searches": total, "checked": len(found["memr1"]), "stride": stride}
    for impl in IMPLS[1:]:
        verdicts = [compare(*ref[i], *found[impl][i]) if i in found[impl] else "differ" for i in ref]
        out[f"memr1_vs_{impl}"] = {v: verdicts.count(v) for v in ("same", "tie", "differ")}
        if "differ" in verdicts:
            i = list(ref)[verdicts.index("differ")]
            raise SystemExit(f"error: S={sh.sessions}: search #{i} differs, memr1 {ref[i][0]} vs {impl} "
                             f"{found[impl].get(i, ('missing',))[0]}")
    return out


# ---- one timed step per subprocess ----
def child(out: str, impl: str, script_path: str, tmp: str, retain: str, steps: str) -> int:
    """Memory from the first full step (what a fresh process needs at its peak), time from the `steps`
    steps after it: a trainer runs step after step in one process, and a first step in a new one pays
    for heap growth and page faults that later steps do not (the baselines, which allocate more, most)."""
    with open(script_path, "rb") as f:
        script = pickle.load(f)
    side = Side(impl, tmp)
    prepared = prepare(script, side)
    # Warm-up, untimed (first calls load code and fill caches): episode 0's first two sessions, one
    # re-run of its session 1 and two questions, at the script's own k.
    sessions, _, final_q = prepared
    warm = replace(script.shape, group=1, sessions=min(2, script.shape.sessions), inner_n=1)
    rerolls = {1: (0, [sessions[0][1]], final_q[:2])} if warm.sessions > 1 else {}
    replay(warm, ([sessions[0]], rerolls, final_q[:2]), side, retain)
    side.bytes = 0
    gc.collect()
    base, reset = status_mb("VmRSS"), True
    try:
        Path("/proc/self/clear_refs").write_text("5")   # VmHWM := VmRSS, so the peak is the step's own
    except OSError:
        reset = False
    got = replay(script.shape, prepared, side, retain)
    peak = status_mb("VmHWM")
    later = [replay(script.shape, prepared, side, retain) for _ in range(int(steps))]
    floor = call_floor_s()
    del got["found"]
    got.update({k: statistics.median(r[k] for r in later) for k in TIMED}, first_step_s=got["wall_s"],
               steps_timed=len(later), peak_rss_mb=peak, base_rss_mb=base, rss_growth_mb=max(0.0, peak - base),
               peak_reset=reset, call_floor_s=floor)
    Path(out).write_text(json.dumps(got))
    return 0


class _Empty:
    def call(self, bank, key):
        return bank


def call_floor_s(n: int = 20000, repeats: int = 5) -> float:
    """The floor of a snapshot op in Python: one call of an empty method (the loop around it included,
    as replay has one), the fastest of `repeats` runs of n, measured in each child beside its steps."""
    o, best = _Empty(), float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for i in range(n):
            o.call(i, 0)
        best = min(best, (time.perf_counter() - t) / n)
    return best


def run_child(mode: str, out: Path, *args, env: dict | None = None) -> dict:
    """`python -m memr1.bench.episodes MODE OUT ARGS...` in a fresh process (its own peak RSS, no heap
    left by the parent or an earlier impl); returns the row it wrote to OUT. A child's one-line `error:`
    (exit 2) ends the bench with that line; any other failure is a bug and shows the child's output."""
    out.unlink(missing_ok=True)   # a child that fails to write must not hand back the previous row
    p = subprocess.run([sys.executable, "-m", "memr1.bench.episodes", mode, str(out), *map(str, args)],
                       env=env, capture_output=True, text=True)
    last = (p.stderr.strip().splitlines() or [""])[-1]
    if p.returncode == 2 and last.startswith("error: "):
        print(last, file=sys.stderr)
        raise SystemExit(2)
    if p.returncode:
        raise RuntimeError(f"bench.episodes {mode} {' '.join(map(str, args))} failed:\n{p.stdout[-2000:]}"
                           f"{p.stderr[-4000:]}")
    return json.loads(out.read_text())


def row_of(impl: str, sh: Shape, runs: list[dict]) -> dict:
    med = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
    step, growth, first = [r["wall_s"] for r in runs], med("rss_growth_mb"), runs[0]
    pickled = impl == "pickle_snapshots"
    return {"impl": impl, "sessions": sh.sessions, "group": sh.group, "inner_n": sh.inner_n,
            "episodes_per_s": sh.group / statistics.median(step), "step_s": statistics.median(step),
            "step_s_spread": [min(step), max(step)], "first_step_s": med("first_step_s"),
            **{k: med(k) for k in TIMED[1:]}, "rounds": len(runs), "steps_per_round": first["steps_timed"],
            "peak_rss_mb": med("peak_rss_mb"), "rss_growth_mb": growth,
            "rss_growth_spread": [min(r["rss_growth_mb"] for r in runs), max(r["rss_growth_mb"] for r in runs)],
            # the work: one script, so the same in every round and for every impl (tested)
            **{k: first[k] for k in ("n_snapshots", "n_restores", "n_searches", "n_ops", "rows_written",
                                     "bank_rows_final", "snapshots_held_max")},
            "bytes_per_snapshot": first["snapshot_bytes"] / first["n_snapshots"] if pickled
            else growth * 2**20 / max(1, first["snapshots_held_max"]),
            "bytes_per_snapshot_is": "pickle file size" if pickled else "rss growth / snapshots held",
            "pickle_mb_written": first["snapshot_bytes"] / 2**20 if pickled else None,   # on disk, not in RSS
            "rss_kb_per_row_written": growth * 1024 / max(1, first["rows_written"]),
            "snapshot_s_per_episode": med("snapshot_s") / sh.group,
            # one empty Python call per snapshot, restore and release the step makes: no snapshot op costs less
            "snapshot_calls": 2 * first["n_snapshots"] + first["n_restores"], "call_floor_s": med("call_floor_s"),
            "snapshot_floor_s": (2 * first["n_snapshots"] + first["n_restores"]) * med("call_floor_s"),
            "snapshot_floor_share": (2 * first["n_snapshots"] + first["n_restores"]) * med("call_floor_s") /
            med("snapshot_s") if med("snapshot_s") > 0 else None,
            "peak_reset": all(r["peak_reset"] for r in runs)}


BASELINES = (("pickle_snapshots", "pickle"), ("deepcopy", "deepcopy"), ("cow_numpy", "cow"))
TARGET_S = 32   # the target: at S = 32, memr1's snapshot cost >= 2x the copy-on-write bank's, its RSS growth <= its


def headline(mine: dict, sessions: int) -> list[dict]:
    """memr1 over each baseline at one S. First the snapshot cost: snapshot_s (snapshot, restore and
    drop, the whole step's) over memr1's, with each side's share of its Python-call floor
    (snapshot_floor_share) and, beside it, the whole bank step's ratio (`step_ratio`) and that ratio if
    memr1's snapshots cost nothing (`free_snapshot_ratio`, its ceiling: both sides do the same searches
    and ops, so faster forks alone cannot lift the step past it). Then RSS growth per row written,
    the baseline's over memr1's; a growth below one page of RSS makes it None, not huge."""
    out, a = [], mine["memr1"]
    rest = a["step_s"] - a["snapshot_s"]
    for impl, short in BASELINES:
        b, at = mine[impl], sessions == TARGET_S and short == "cow"
        out.append(headline_entry(
            f"S={sessions}: memr1 over {short}, snapshot+restore+drop", b["snapshot_s"] / a["snapshot_s"]
            if a["snapshot_s"] > 0 else None, f"memr1 S={sessions}", f"{impl} S={sessions}",
            f"{impl}'s snapshot_s over memr1's (snapshot, restore and drop, per step); step_ratio: memr1's "
            f"episodes_per_s over its (the whole bank step); free_snapshot_ratio: its step_s over memr1's step_s "
            "less memr1's snapshot_s", target=2.0 if at else None,
            ours_s_per_episode=a["snapshot_s_per_episode"], baseline_s_per_episode=b["snapshot_s_per_episode"],
            ours_floor_share=a["snapshot_floor_share"], baseline_floor_share=b["snapshot_floor_share"],
            step_ratio=a["episodes_per_s"] / b["episodes_per_s"],
            free_snapshot_ratio=b["step_s"] / rest if rest > 0 else None))
        grew = a["rss_growth_mb"] >= PAGE_MB
        out.append(headline_entry(
            f"S={sessions}: RSS growth per row written, {short} over memr1",
            b["rss_kb_per_row_written"] / a["rss_kb_per_row_written"] if grew else None,
            f"memr1 S={sessions}", f"{impl} S={sessions}", f"{impl}'s rss_kb_per_row_written over memr1's (peak "
            "RSS growth of one step over the rows it adds or updates)", target=1.0 if at else None,
            ours_kb_per_row=a["rss_kb_per_row_written"], baseline_kb_per_row=b["rss_kb_per_row_written"]))
    return out


def with_generation(gen: dict, mine: dict, sessions: int) -> list[dict]:
    """The snapshot share of a step that also generates (the --generation row: forks and wall time of
    one EpisodeStage step), for memr1 and for each baseline had the step used it instead: the step's
    forks times each impl's snapshot cost per snapshot or restore in this run's bank step at S."""
    per = {impl: r["snapshot_s"] / max(1, r["n_snapshots"] + r["n_restores"]) for impl, r in mine.items()}
    forks, wall = gen["forks"], gen["step_s"]
    share = {impl: forks * c / (wall + forks * (c - per["memr1"])) for impl, c in per.items()}
    return [headline_entry(
        f"with generation: memr1's snapshot share of a step (beside {short})", share["memr1"], "memr1_with_generation",
        f"{impl} S={sessions}", f"the step's forks x memr1's snapshot cost per fork at S={sessions}, over the step's "
        f"wall time; baseline_share: the same with {impl}'s cost, the step's other work unchanged", unit="share",
        better="lower", baseline_share=share[impl], forks=forks, step_s=wall) for impl, short in BASELINES]


# ---- the grid ----
def fs_type(path: Path) -> str:
    """The filesystem pickle_snapshots writes to (ext4, tmpfs, overlay...): it sets what a dump costs."""
    mounts = [line.split()[1:3] for line in Path("/proc/mounts").read_text().splitlines()]
    inside = [(m, kind) for m, kind in mounts if f"{path.resolve()}/".startswith(m.rstrip("/") + "/")]
    return max(inside, key=lambda m: len(m[0]), default=("", "?"))[1]


def parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="G = 4, inner_n = 4, 3 rounds")
    p.add_argument("--json", required=True)
    p.add_argument("--sessions", help="comma-separated S values (default 8,16,32)")
    p.add_argument("--group", type=int, help="episodes G (default 16; --quick 4)")
    p.add_argument("--inner-n", type=int, help="re-rolls per local group (default 8; --quick 4)")
    p.add_argument("--calls", type=int, default=6, help="manager calls per session, on average")
    p.add_argument("--local-questions", type=int, default=16, help="questions per re-run")
    p.add_argument("--global-questions", type=int, default=64, help="questions per final bank")
    p.add_argument("--rounds", type=int, help="processes per impl, alternating order (default 5; --quick 3)")
    p.add_argument("--steps", type=int, help="timed steps per process, after its first (default 3; --quick 2)")
    p.add_argument("--retain", choices=("step", "window"), default="step")
    p.add_argument("--check-sample", type=int, default=4096, help="searches compared across impls per S")
    p.add_argument("--tmp", help="where pickle_snapshots writes (default: the JSON's folder)")
    p.add_argument("--generation", action="store_true", help="add the memr1_with_generation row (SmolLM2)")
    a = p.parse_args(argv)
    a.sessions = [int(s) for s in (a.sessions or "8,16,32").split(",")]
    a.group, a.inner_n = a.group or (4 if a.quick else 16), a.inner_n or (4 if a.quick else 8)
    a.rounds, a.steps = a.rounds or (3 if a.quick else 5), a.steps or (2 if a.quick else 3)
    if a.rounds < 3 or min(a.group, a.inner_n, a.calls, a.steps, *a.sessions) < 1:
        p.error("--rounds must be >= 3; --group, --inner-n, --calls, --steps and --sessions >= 1")
    return a


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--child"]:
        return child(*argv[1:7])
    if argv[:1] == ["--generation-child"]:
        from memr1.engine.preload import preload
        preload()  # tcmalloc + Intel OpenMP, as in production runs (engine/preload.py)
        return generation_child(argv[1])
    args = parse(argv)
    if args.generation and (problem := generation_problem()):
        print(generation_error(problem), file=sys.stderr)
        return 2
    shapes = [Shape(args.group, s, args.inner_n, calls=args.calls, local_questions=args.local_questions,
                    global_questions=args.global_questions) for s in args.sessions]
    (root := Path(args.tmp or Path(args.json).resolve().parent)).mkdir(parents=True, exist_ok=True)
    env = {**dict.fromkeys(THREADS, "1"), **os.environ}   # bank side: one BLAS thread unless set
    rows, checks, head, by_s, t0 = [], {}, [], {}, time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=".episodes-", dir=root) as tmp:
        out = Path(tmp) / "row.json"
        for sh in shapes:
            script = make_script(sh)
            path = Path(tmp) / f"script-S{sh.sessions}.pkl"
            path.write_bytes(pickle.dumps(script, protocol=pickle.HIGHEST_PROTOCOL))
            checks[f"S{sh.sessions}"] = agreement(script, tmp, args.check_sample)
            runs = {impl: [] for impl in IMPLS}
            for r in range(args.rounds):
                for impl in (IMPLS if r % 2 == 0 else IMPLS[::-1]):
                    runs[impl].append(run_child("--child", out, impl, path, tmp, args.retain, args.steps, env=env))
            mine = by_s[sh.sessions] = {impl: row_of(impl, sh, runs[impl]) for impl in IMPLS}
            rows += mine.values()
            head += headline(mine, sh.sessions)
            print(f"  S={sh.sessions} done at {time.perf_counter() - t0:.0f}s", flush=True)
        if args.generation:   # with the machine's threads, as a training run has them
            rows.append(run_child("--generation-child", out))
            top = max(by_s)
            head += with_generation(rows[-1], by_s[top], top)
    print_table(rows, ["impl", "sessions", "group", "inner_n", "episodes_per_s", "step_s", "first_step_s", "snapshot_s",
                       "search_s", "op_s", "snapshot_s_per_episode", "snapshot_floor_share", "peak_rss_mb",
                       "rss_growth_mb", "rss_kb_per_row_written", "n_snapshots", "rows_written", "bytes_per_snapshot",
                       "bank_rows_final", "gen_share", "bank_share"])
    fmt = lambda x, f="{:.2f}x": "n/a" if x is None else f.format(x)  # noqa: E731
    for h in head:
        if "step_ratio" in h:
            print(f"  {h['name']}: {fmt(h['value'])} (target {fmt(h['target'])}), floor share memr1 "
                  f"{fmt(h['ours_floor_share'], '{:.1%}')} vs {fmt(h['baseline_floor_share'], '{:.1%}')}; whole step "
                  f"{fmt(h['step_ratio'])}, ceiling {fmt(h['free_snapshot_ratio'])}")
        elif "baseline_share" in h:
            print(f"  {h['name']}: {fmt(h['value'], '{:.2%}')} vs {fmt(h['baseline_share'], '{:.2%}')}")
        else:
            print(f"  {h['name']}: {fmt(h['value'])} (target {fmt(h['target'])}), {h['ours_kb_per_row']:.2f} vs "
                  f"{h['baseline_kb_per_row']:.2f} KiB a row")
    settings = {**{k: getattr(args, k) for k in ("sessions", "group", "inner_n", "rounds", "steps", "retain",
                                                 "check_sample", "generation")},
                **{k: getattr(shapes[0], k) for k in ("calls", "k_call", "k_question", "local_questions",
                                                      "global_questions", "reroll_prob", "seed")},
                "op_mix": MIX, "dim": DIM, "cow_fold": [CowBank.FOLD_MIN, CowBank.FOLD_FRAC], "tie_tolerance": TOL,
                "pickle_protocol": pickle.HIGHEST_PROTOCOL,
                "pickle_dir": str(root), "pickle_fs": fs_type(root), "child_threads": {k: env[k] for k in THREADS}}
    write_json(args.json, "episodes", rows, headline=head, settings=settings, agreement=checks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
