"""Tables of headline numbers, made from bench JSONs' `headline` entries (bench/common.py).

    python -m memr1.bench.table results/                      every entry of the newest run of each bench
    python -m memr1.bench.table results/ --readme             the tables README.md shows
    python -m memr1.bench.table results/ --readme --update README.md   rewrite them there, between markers
    python -m memr1.bench.table runs/bench/*.json [--out FILE]        given JSON files, every entry

results/ holds one folder per measuring run, named <date>-<host> (results/2026-12-07-xeon/), with the
JSONs its benches wrote. For each (bench, recipe) pair the table takes the newest folder holding one:
the recipe is the config's file stem for bench.learning (so the tables of several recipes coexist), the
task for bench.headroom on a task other than the default synthetic set, and nothing for the other
benches. Folders are ordered by the date in their name, then by when their JSON was written. A later
results folder for a bench therefore replaces the older one, and rows of different
benches may come from different runs: each row names its host, commit, command and JSON.

One markdown row per entry: bench, entry, the two rows it compares, value (with its interval where it
has one), target (met or not), host, commit and the command that reproduces it. A JSON from a dirty
checkout is flagged, since its numbers cannot be reproduced from one commit.

README.md quotes no bench number by hand: `--readme` prints its tables, choosing a few entries per bench
(README_PICK), and tests/test_readme_tables.py checks that README.md holds exactly that output between
`<!-- table:results begin -->` and `<!-- table:results end -->`.
"""
import argparse
import json
import re
import shlex
import sys
from pathlib import Path

COLUMNS = ("bench", "headline", "ours / baseline", "value", "target", "host", "commit", "command")
README_COLUMNS = COLUMNS + ("JSON",)
BEGIN, END = "<!-- table:results begin -->", "<!-- table:results end -->"
FOLDER = re.compile(r"(\d{4}-\d{2}-\d{2})-[A-Za-z0-9][A-Za-z0-9._-]*")
# A results JSON holds rows and a headline, not per-sample dumps; anything larger is a mistake, and
# reading it whole would be the first sign.
MAX_JSON_BYTES = 8 << 20
EMPTY = "No measuring run in results/ yet: results/README.md says how one is added.\n"

# The benches of the speed table, in the README's order; any other bench follows, by name.
ORDER = ("e2e", "train_step", "rollout", "loop", "kernels", "attention", "memory_ops", "episodes", "rollouts",
         "op_probe", "gpu_learner", "lora")
# Which entries a README table shows, per bench: (regex on the entry's name, "all" or "worst"). A pattern
# takes every entry it matches, in the bench's order, or with "worst" only the one least favourable to
# memr1 (over sizes or group sizes: the README shows no best case). A bench not listed here, or whose
# patterns match nothing (a --quick run names other sizes or rows), shows its entries that carry a target,
# else its first one. op_probe diagnoses a training run's reward, so only the full table shows it.
# benches whose entries are learning results (EM points on a split), tabled apart from speed
LEARNING = ("learning", "headroom", "op_targets")
README_PICK = {
    "e2e": ((r"^SmolLM2-135M-Instruct: memr1_noskip over trl_vllm", "all"),
            (r"refill over skip-only, wall per informative group$", "all")),
    "train_step": ((r"memr1_noshare over trl_compact", "worst"), (r"memr1 over trl,", "worst")),
    "rollout": ((r"^manager: .* over vllm", "worst"),),
    "loop": ((r"^SmolLM2-135M-Instruct: max_staleness 1 over 0", "all"),),
    "kernels": ((r"^grpo_advantage .*: compiled$", "worst"), (r"^gae .*: over the numba loop$", "worst"),
                (r"^gae .*: share of the bandwidth floor$", "worst"),
                (r"^logprobs .*: time over", "worst")),
    "attention": ((r"dense_mask over memr1_prefix", "worst"),),
    "lora": ((r".", "all"),),
    "memory_ops": ((r"^(add|update) @ .*: memr1 p99$", "all"), (r"^fork rollout @ .* G=64$", "all"),
                   (r"^compaction @ .*: search p99 during over idle$", "all"),
                   (r"^scale .*: slowest op kind's p50$", "all")),
    # Against the copy-on-write numpy bank, the baseline a competent user writes (pickle and deepcopy are
    # in the full table).
    "episodes": ((r"^S=32: memr1 over cow, snapshot\+restore\+drop$", "all"),
                 (r"^S=32: RSS growth per row written, cow over memr1$", "all")),
    "op_probe": (),
    # The margin at each data seed, and the rule's verdict over them (bench/headroom.py:RULE).
    "headroom": ((r"oracle banks - ADD-every-fact banks", "all"), (r"no-headroom condition", "all")),
    # Per run of the JSON (data seed, seed): the manager's RL part and RL against rejection sampling on
    # its own rollouts, and the answer agent's RL part on the banks it trained on.
    "learning": ((r": manager em_fixed_answerer, trained manager - (warm|rejection-sampling) manager$", "all"),
                 (r": answer em_warm_manager_banks, trained answer agent - (warm|rejection-sampling) answer agent$",
                  "all")),
}


class TableError(ValueError):
    """A results folder or JSON the table cannot use; the message names it and fits on one line."""


def fmt_value(value, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "share":
        return f"{value:.0%}"
    return f"{value:+.1f} {unit}" if unit == "points" else f"{value:,.3g} {unit}"


def fmt_target(h: dict) -> str:
    if h["target"] is None:
        return ""
    sign = ">=" if h["better"] == "higher" else "<="
    met = "met" if h["met"] else "missed" if h["met"] is False else "n/a"
    return f"{sign} {fmt_value(h['target'], h['unit'])} ({met})"


def command(data: dict) -> str:
    """The bench's command line as it ran (argv[0] is the module's file), the JSON named by its file name."""
    argv = [str(a) for a in list(data["machine"].get("argv") or [])[1:]]
    for i, arg in enumerate(argv[:-1]):
        if arg == "--json":
            argv[i + 1] = Path(argv[i + 1]).name
    # A backtick would end the code span the command is printed in.
    return " ".join(["python -m memr1.bench." + data["bench"], *map(shlex.quote, argv)]).replace("`", "'")


def host(machine: dict) -> str:
    gpu = f", {machine['gpu']}" if machine.get("gpu") else ""
    return f"{machine.get('cpu', '?')}, {machine.get('cpus', '?')} cpus{gpu}"


def commit_of(machine: dict) -> str:
    commit = str(machine.get("commit") or "?")
    return commit[:7] + ("+dirty" if commit.endswith("+dirty") else "")


def value_text(h: dict) -> str:
    text = fmt_value(h["value"], h["unit"])
    if h.get("ci_low") is not None and h.get("ci_high") is not None:
        return text + f" [{h['ci_low']:+.1f}, {h['ci_high']:+.1f}]"
    # An entry that carries interval keys but no interval: over LoCoMo's one val conversation there is
    # nothing to resample (rl/task/eval/stats.py), which is not the same as a certain number.
    return text + (" (no interval)" if "ci_low" in h and h["value"] is not None else "")


def rows_of(data: dict, source: str, entries: list[dict] | None = None) -> list[list[str]]:
    """One row per headline entry (or per one of `entries`), in COLUMNS' order."""
    if not data.get("headline"):
        raise ValueError(f"{source}: bench {data.get('bench')!r} wrote no headline")
    m = data["machine"]
    return [[bench_label(data), h["name"], f"{h['ours']} / {h['baseline']}", value_text(h), fmt_target(h), host(m),
             commit_of(m), f"`{command(data)}`"] for h in (data["headline"] if entries is None else entries)]


def markdown(rows: list[list[str]], columns=COLUMNS) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]) + "\n"


def cell(text: str) -> str:
    """A table cell: a line break or a bar from a JSON would end the row or the cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


# ---------------------------------------------------------------------------------------- results/
def recipe(data: dict) -> str | None:
    """bench.learning's recipe, the stem of its config file (default, outcome, ...); bench.headroom's task
    when it is not the default synthetic set (budget); None for the rest."""
    if data.get("bench") == "headroom":
        task = data.get("task")
        return str(task) if task and task != "synthetic" else None
    if data.get("bench") != "learning":
        return None
    config = (data.get("settings") or {}).get("config")
    return Path(str(config)).stem if config else "default"


def bench_label(data: dict) -> str:
    r = recipe(data)
    return data["bench"] + (f" ({r})" if r else "")


def read_json(path: Path) -> dict:
    """A bench JSON, checked for what the tables read; TableError (one line, naming the file) otherwise."""
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise TableError(f"over {MAX_JSON_BYTES >> 20} MiB; a results JSON holds rows and a headline only")
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("bench"), str) \
                or not isinstance(data.get("machine"), dict):
            raise TableError("not a bench JSON (no 'bench' name or 'machine' object)")
        heads = data.get("headline")
        if not isinstance(heads, list) or not heads:
            raise TableError(f"bench {data['bench']!r} wrote no headline")
        for h in heads:
            if not isinstance(h, dict) or not isinstance(h.get("name"), str):
                raise TableError("a headline entry without a name")
            rows_of(data, str(path), [h])   # every field the row needs, formatted once as a check
        return data
    except TableError as e:
        raise TableError(f"{path}: {e}") from None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise TableError(f"{path}: not a bench JSON with a headline ({type(e).__name__}: {e})") from None


def newest_runs(root: Path) -> list[tuple[str, list[tuple[Path, dict]]]]:
    """[(bench label, [(json path, data), ...])] for the newest folder of each (bench, recipe) pair,
    in the README's order (ORDER, then by name; learning last, recipe "default" first)."""
    if not root.is_dir():
        raise TableError(f"{root}: no such folder")
    found: dict[tuple, dict] = {}   # (bench, recipe) -> {folder key: [(path, data)]}
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        date = FOLDER.fullmatch(folder.name)
        if date is None:
            raise TableError(f"{folder}: a run folder is named <date>-<host>, e.g. 2026-12-07-xeon")
        for path in sorted(folder.glob("*.json")):
            data = read_json(path)
            runs = found.setdefault((data["bench"], recipe(data)), {})
            runs.setdefault((date.group(1), folder.name), []).append((path, data))
    out = []
    for (bench, rec), runs in found.items():
        # newest: the latest date; on one date, the folder whose JSON of this pair was written last
        key = max(runs, key=lambda k: (k[0], max(str(d["machine"].get("time") or "") for _, d in runs[k]), k[1]))
        out.append(((bench == "learning", rec != "default", ORDER.index(bench) if bench in ORDER else len(ORDER),
                     bench, rec or ""), bench_label(runs[key][0][1]), runs[key]))
    return [(label, files) for _, label, files in sorted(out, key=lambda t: t[0])]


def pick(bench: str, heads: list[dict]) -> list[dict]:
    """The entries of one JSON a README table shows (README_PICK)."""
    if bench in README_PICK and not README_PICK[bench]:
        return []
    chosen = []
    for pattern, how in README_PICK.get(bench, ()):
        hits = [h for h in heads if re.search(pattern, h["name"])]
        chosen += hits if how == "all" else [min(hits, key=favour)] if hits else []
    if not chosen:
        chosen = [h for h in heads if h.get("target") is not None] or heads[:1]
    return [h for h in heads if any(h is c for c in chosen)]   # the bench's own order, each once


def favour(h: dict) -> tuple:
    """Sorts entries from the least favourable to memr1 up; no value at all is the least."""
    if h["value"] is None:
        return (0, 0.0)
    return (1, h["value"] if h["better"] == "higher" else -h["value"])


def link(root: Path, path: Path) -> str:
    """A JSON's link from README.md, which sits beside results/."""
    return f"[{path.parent.name}/{path.name}]({root.name}/{path.parent.name}/{path.name})"


def results_table(root: Path) -> str:
    """Every entry of the newest run of each (bench, recipe), with its command and JSON."""
    rows = []
    for _, files in newest_runs(root):
        for path, data in files:
            rows += [r + [f"{root.name}/{path.parent.name}/{path.name}"] for r in rows_of(data, str(path))]
    return markdown(rows, README_COLUMNS)


def readme_tables(root: Path) -> str:
    """What README.md shows between BEGIN and END: one table of the speed and memory benches and one of
    the learning recipes, a few entries per bench (README_PICK), each row with its command and JSON."""
    groups = newest_runs(root)
    if not groups:
        return EMPTY
    speed, learning = [], []
    for _, files in groups:
        for path, data in files:
            rows = [r + [link(root, path)] for r in rows_of(data, str(path), pick(data["bench"], data["headline"]))]
            (learning if data["bench"] in LEARNING else speed).extend(rows)
    parts = []
    if speed:
        parts.append("**Speed and memory** (a ratio above 1x favours memr1):\n\n" + markdown(speed, README_COLUMNS))
    if learning:
        parts.append("**Learning** (`learning (<recipe>)`: configs/<recipe>.toml; EM points on the held-out test "
                     "split, 95% intervals that resample conversations):\n\n" + markdown(learning, README_COLUMNS))
    return "\n".join(parts)


def update(path: Path, text: str) -> None:
    """Replace what lies between BEGIN and END in `path` with `text`."""
    doc = path.read_text(encoding="utf-8")
    if doc.count(BEGIN) != 1 or doc.count(END) != 1 or doc.index(BEGIN) > doc.index(END):
        raise TableError(f"{path}: needs one '{BEGIN}' line and, after it, one '{END}' line")
    head, rest = doc.split(BEGIN, 1)
    path.write_text(head + BEGIN + "\n" + text + END + rest.split(END, 1)[1], encoding="utf-8")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("jsons", nargs="+", help="bench JSON files (written with --json), or one results/ folder")
    p.add_argument("--out", default=None, help="write the markdown here (default: print it)")
    p.add_argument("--readme", action="store_true", help="with results/: the tables README.md shows")
    p.add_argument("--update", metavar="FILE", default=None,
                   help=f"with --readme: replace the text between {BEGIN} and {END} in FILE")
    args = p.parse_args(argv)
    folder = len(args.jsons) == 1 and Path(args.jsons[0]).is_dir()
    if (args.readme or args.update) and not folder:
        p.error("--readme and --update take one results/ folder")
    if args.update and not args.readme:
        p.error("--update needs --readme")
    try:
        if folder:
            root = Path(args.jsons[0])
            text = readme_tables(root) if args.readme else results_table(root)
            commits = {str(d["machine"].get("commit")) for _, files in newest_runs(root) for _, d in files}
            if any(c.endswith("+dirty") or c == "None" for c in commits):
                print("warning: some JSONs come from a dirty checkout or an unknown commit", file=sys.stderr)
            if args.update:
                update(Path(args.update), text)
                print(f"updated {args.update}")
                return 0
        else:
            text, commits = file_table(args.jsons)
    except TableError as e:
        print("error: " + " ".join(str(e).split()), file=sys.stderr)   # one line, whatever the file held
        return 2
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text, end="")
    return 0


def file_table(paths: list[str]) -> tuple[str, set]:
    """Every entry of the given JSON files, in the order given."""
    rows, commits = [], set()
    for path in paths:
        if Path(path).is_dir():
            raise TableError(f"{path}: a folder; give one results/ folder alone, or JSON files")
        data = read_json(Path(path))
        rows += rows_of(data, path)
        commits.add(data["machine"].get("commit"))
    if len(commits) > 1 or any(str(c).endswith("+dirty") or c is None for c in commits):
        print(f"warning: the JSONs come from {len(commits)} commit(s) {sorted(map(str, commits))}, not one clean "
              "commit", file=sys.stderr)
    return markdown(rows), commits


if __name__ == "__main__":
    raise SystemExit(main())
