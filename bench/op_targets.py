"""Do a manager's ops name their memory twice, consistently? Each UPDATE, DELETE and NONE gives a shown
memory's id and copies that memory's text into "old_memory"; when the two name different shown
memories, addressing by id (what the bank does) and addressing by content disagree.

    python -m memr1.bench.op_targets ROLLOUT_DIR [ROLLOUT_DIR ...] --json PATH

ROLLOUT_DIR: a `memr1 rollout --stage manager` folder (its shards carry `refs`, `shown_ids` and
`shown_texts`). One row per event (UPDATE, DELETE, NONE, and "change": UPDATE and DELETE together),
counting the parsed references:
  consistent   old_memory is the text of the memory the id names
  conflict     old_memory is the text of another shown memory: id and content name different memories
  unmatched    old_memory is no shown memory's text (a paraphrase, a new text) or is missing
  bad_id       the id names no shown memory
Texts compare after trimming and case-folding. The headline is the conflict share of the changes, beside
the threshold above which content addressing (`manager.resolve = "text"`) is worth adding.
"""
import argparse
from collections import Counter
from pathlib import Path

from memr1.bench.common import headline_entry, print_table, write_json

THRESHOLD = 0.05   # the share of conflicting changes above which addressing by content is worth a config
KINDS = ("consistent", "conflict", "unmatched", "bad_id")
COLUMNS = ["event", "refs", *KINDS, "conflict_share"]


def norm(text) -> str:
    return " ".join(str(text).split()).casefold()


def classify(ref: dict, shown_texts: list[str]) -> str:
    """One reference's kind (module doc)."""
    i = ref.get("local_id")
    if i is None or not 0 <= i < len(shown_texts):
        return "bad_id"
    old = ref.get("old_memory")
    matches = [j for j, t in enumerate(shown_texts) if old is not None and norm(t) == norm(old)]
    if not matches:
        return "unmatched"
    return "consistent" if i in matches else "conflict"


def counts(rows: list[dict]) -> dict[str, Counter]:
    """event -> kind -> count over the completions' references."""
    out: dict[str, Counter] = {e: Counter() for e in ("UPDATE", "DELETE", "NONE")}
    for r in rows:
        for ref in r.get("refs") or ():
            if ref.get("event") in out:
                out[ref["event"]][classify(ref, r.get("shown_texts") or [])] += 1
    out["change"] = out["UPDATE"] + out["DELETE"]
    return out


def table(by_event: dict[str, Counter]) -> list[dict]:
    rows = []
    for event, c in by_event.items():
        n = sum(c.values())
        rows.append({"event": event, "refs": n, **{k: c[k] for k in KINDS},
                     "conflict_share": c["conflict"] / n if n else None})
    return rows


def main(argv=None) -> int:
    from memr1.engine.rollout_files import RolloutDirError, read_completions

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("rollouts", nargs="+", help="memr1 rollout --stage manager folders")
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    rows = []
    for folder in args.rollouts:
        try:
            t = read_completions(Path(folder))
        except RolloutDirError as e:
            raise SystemExit(f"error: {folder}: {e}") from None
        if "refs" not in t.column_names:
            raise SystemExit(f"error: {folder}: its shards have no refs column (written before it existed); "
                             f"roll out again")
        rows += t.select(["refs", "shown_texts"]).to_pylist()
    out = table(counts(rows))
    print_table(out, COLUMNS)
    change = next(r for r in out if r["event"] == "change")
    write_json(args.json, "op_targets", out, headline=[headline_entry(
        "share of UPDATE and DELETE whose id and copied text name different shown memories", change["conflict_share"],
        "conflicting references", "all UPDATE and DELETE references",
        f"above {THRESHOLD:.0%}, addressing memories by content is worth a config", unit="share", better="lower",
        threshold=THRESHOLD, refs=change["refs"])], rollouts=args.rollouts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
