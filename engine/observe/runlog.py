"""A run's log: metrics.jsonl (one JSON object per step, every stage), TensorBoard scalars under
tb/<stage>/, and a progress bar per stage.

On resume both are cut back to the checkpoints: `truncate_metrics` drops each stage's lines past
the step it resumes from (steps written after the last checkpoint, e.g. before a kill -9, are trained
again and would otherwise appear twice), and a stage's TensorBoard writer purges the events past its
start step."""
import json
import os
from pathlib import Path

from tqdm import tqdm


class RunLog:
    """Fed one metrics dict per step (rank 0 only)."""

    def __init__(self, run_dir: Path, stage: str, total: int, start: int):
        from torch.utils.tensorboard import SummaryWriter

        self.file = open(run_dir / "metrics.jsonl", "a")
        tb = run_dir / "tb" / stage
        # Earlier events at steps > start are hidden by TensorBoard once a writer starts at start + 1.
        self.tb = SummaryWriter(str(tb), purge_step=start + 1 if tb.is_dir() else None)
        self.bar = tqdm(total=total, initial=start, desc=f"train {stage}", unit="step", dynamic_ncols=True)

    def __call__(self, m: dict, advance: bool = True) -> None:
        """Log one step's metrics (advance=False: a row that trained nothing, e.g. a phase's start validated)."""
        m = {k: (v.item() if hasattr(v, "item") else v) for k, v in m.items()}  # 0-d tensors -> numbers
        if "response_tokens" in m and m.get("step_s"):
            m["tokens_per_s"] = m["response_tokens"] / m["step_s"]
        self.file.write(json.dumps(m) + "\n")
        self.file.flush()
        for k, v in m.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
                self.tb.add_scalar(f"{m['stage']}/{k}", v, m["step"])
        shown = {"reward": m.get("reward_mean"), "em": m.get("em_mean"), "nll": m.get("nll"),
                 "val_em": m.get("val_em_mean")}
        refill = {"refill": f"+{m['refill_drawn']}/-{m['refill_dropped']}"} if "refill_drawn" in m else {}
        self.bar.set_postfix({k: f"{v:.3f}" for k, v in shown.items() if isinstance(v, (int, float))} |
                             {"tok_s": f"{m.get('tokens_per_s', 0):.0f}"} | refill)
        self.bar.update(1 if advance else 0)

    def close(self) -> None:
        self.bar.close()
        self.tb.close()
        self.file.close()


def truncate_metrics(run_dir: Path, keep: dict[str, int]) -> int:
    """Keep, of each stage named in `keep`, the metrics lines with step <= keep[stage]; other stages'
    lines stay, and a torn line (a kill mid-write) goes. Returns the number of lines dropped."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return 0
    lines = path.read_bytes().splitlines()   # bytes: a line that is not UTF-8 goes like a torn one
    kept = []
    for line in lines:
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue
        stage, step = (row.get("stage"), row.get("step")) if isinstance(row, dict) else (None, None)
        if stage not in keep or not isinstance(step, int) or step <= keep[stage]:
            kept.append(line)
    if len(kept) < len(lines):
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_bytes(b"".join(line + b"\n" for line in kept))
        os.replace(tmp, path)
    return len(lines) - len(kept)
