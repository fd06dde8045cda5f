"""`memr1 data synth`: a built-in set (synthetic.py's, or budget.py's budgeted task) written as a
LoCoMo-format JSON file."""
import json
import sys
from pathlib import Path

from memr1.rl.fileio import write_atomic
from memr1.rl.task.data import synthesize

# Far more than any experiment here uses (LoCoMo has 10): bigger is minutes of CPU and gigabytes of JSON.
MAX_CONVERSATIONS = 10_000


def synth_cli(args) -> int:
    """`memr1 data synth --out PATH [--conversations N --seed S --kind synthetic|budget]`."""
    out = Path(args.out)
    # Only the file is created: a mistyped folder is an error, not a new directory tree.
    problem = ("is a directory" if out.is_dir() else
               f"its folder {out.parent} does not exist" if not out.parent.is_dir() else None)
    if problem or not 1 <= args.conversations <= MAX_CONVERSATIONS:
        print(f"error: --out {out}: {problem}" if problem else
              f"error: --conversations must be 1 to {MAX_CONVERSATIONS}, got {args.conversations}", file=sys.stderr)
        return 2
    data = synthesize(args.conversations, args.seed, args.kind)
    try:   # whole or not at all: a full disk leaves no torn file behind
        write_atomic(out, json.dumps(data, indent=1))
    except OSError as e:
        print(f"error: --out {out}: cannot write it ({e.strerror or e})", file=sys.stderr)
        return 2
    n_turns = sum(len(v) for c in data for k, v in c["conversation"].items() if isinstance(v, list))
    n_qa = sum(len(c["qa"]) for c in data)
    splits = {s: sum(c["memr1_split"] == s for c in data) for s in ("train", "val", "test")}
    print(f"wrote {out}: {len(data)} conversations ({splits}), {n_turns} turns, {n_qa} questions")
    return 0
