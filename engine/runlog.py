"""A run's log: metrics.jsonl (one JSON object per step, every stage), TensorBoard scalars under
tb/<stage>/, and a progress bar per stage."""
import json
from pathlib import Path

from tqdm import tqdm


class RunLog:
    """Fed one metrics dict per step (rank 0 only)."""

    def __init__(self, run_dir: Path, stage: str, total: int, start: int):
        from torch.utils.tensorboard import SummaryWriter

        self.file = open(run_dir / "metrics.jsonl", "a")
        self.tb = SummaryWriter(str(run_dir / "tb" / stage))
        self.bar = tqdm(total=total, initial=start, desc=f"train {stage}", unit="step", dynamic_ncols=True)

    def __call__(self, m: dict) -> None:
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
        self.bar.set_postfix({k: f"{v:.3f}" for k, v in shown.items() if isinstance(v, (int, float))} |
                             {"tok_s": f"{m.get('tokens_per_s', 0):.0f}"})
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
        self.tb.close()
        self.file.close()
