"""README's table of headline numbers, made from bench JSONs' `headline` entries (bench/common.py).

    python -m memr1.bench.table runs/bench/*.json [--out FILE]

One markdown row per entry: bench, entry, the two rows it compares, value, target (met or not), host,
commit and the command that reproduces it. The table is the only place README.md quotes a bench's
numbers, so each one traces to a JSON of one run. A JSON from a dirty checkout or of several commits
is flagged, since its numbers cannot be reproduced from one commit.
"""
import argparse
import json
import shlex
import sys
from pathlib import Path

COLUMNS = ("bench", "headline", "ours / baseline", "value", "target", "host", "commit", "command")


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
    return f"{sign} {fmt_value(h['target'], h['unit'])} ({'met' if h['met'] else 'missed' if h['met'] is False else 'n/a'})"


def command(data: dict) -> str:
    """The bench's command line as it ran (argv[0] is the module's file), the JSON named by its file name."""
    argv = list(data["machine"].get("argv") or [])[1:]
    for i, arg in enumerate(argv[:-1]):
        if arg == "--json":
            argv[i + 1] = Path(argv[i + 1]).name
    return " ".join(["python -m memr1.bench." + data["bench"], *map(shlex.quote, argv)])


def host(machine: dict) -> str:
    return f"{machine.get('cpu', '?')}, {machine.get('cpus', '?')} cpus" + (f", {machine['gpu']}" if machine.get("gpu") else "")


def rows_of(data: dict, source: str) -> list[list[str]]:
    if not data.get("headline"):
        raise ValueError(f"{source}: bench {data.get('bench')!r} wrote no headline")
    m = data["machine"]
    commit = (m.get("commit") or "?")[:7] + ("+dirty" if str(m.get("commit", "")).endswith("+dirty") else "")
    out = []
    for h in data["headline"]:
        extra = f" [{h['ci_low']:+.1f}, {h['ci_high']:+.1f}]" if h.get("ci_low") is not None and h.get("ci_high") is not None else ""
        out.append([data["bench"], h["name"], f"{h['ours']} / {h['baseline']}", fmt_value(h["value"], h["unit"]) + extra,
                    fmt_target(h), host(m), commit, f"`{command(data)}`"])
    return out


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return "\n".join(lines + ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("jsons", nargs="+", help="bench JSON files (written with --json)")
    p.add_argument("--out", default=None, help="write the markdown here (default: print it)")
    args = p.parse_args(argv)
    rows, commits = [], set()
    for path in args.jsons:
        try:
            data = json.loads(Path(path).read_text())
            rows += rows_of(data, path)
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"error: {path}: not a bench JSON with a headline ({e!r})", file=sys.stderr)
            return 2
        commits.add(data["machine"].get("commit"))
    text = markdown(rows)
    if len(commits) > 1 or any(str(c).endswith("+dirty") or c is None for c in commits):
        print(f"warning: the JSONs come from {len(commits)} commit(s) {sorted(map(str, commits))}, not one clean "
              "commit", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
