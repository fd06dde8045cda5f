"""The PNG figures of `memr1 report`. Each function draws one figure from plain data, saves it, and
returns the series it plotted ({label: (x, y)}), so a caller (or a test) can see what is in it.

matplotlib's object API with the Agg canvas: no pyplot, so no global figure state and no backend
switch in a process that already uses one.
"""
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from memr1.engine.observe.throughput import phase_seconds
from memr1.rl.fileio import write_atomic
from memr1.rl.task.eval.scoring import TABLE_ORDER

DPI = 90
CATEGORIES = (*TABLE_ORDER, "overall")
PHASE_COLORS = {"generate": "tab:blue", "score": "tab:orange", "train": "tab:green", "sync": "tab:red",
                "validate": "tab:purple", "other": "tab:gray"}


def smooth(y: np.ndarray) -> np.ndarray:
    """Trailing mean over ~5% of the steps (3 to 25; none below 6 steps); NaN-aware."""
    w = min(25, max(3, len(y) // 20)) if len(y) >= 6 else 1
    if w == 1:
        return y.copy()
    ok = ~np.isnan(y)
    num = np.convolve(np.where(ok, y, 0.0), np.ones(w), "full")[:len(y)]
    den = np.convolve(ok.astype(float), np.ones(w), "full")[:len(y)]
    with np.errstate(invalid="ignore", divide="ignore"):
        return num / den


def column(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the rows that hold a number under `key`."""
    pts = [(r["step"], float(r[key])) for r in rows
           if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    if not pts:
        return np.empty(0), np.empty(0)
    x, y = zip(*pts)
    return np.asarray(x, dtype=float), np.asarray(y, dtype=float)


def _save(fig: Figure, path: Path, **margins) -> None:
    # Fixed margins: matplotlib's layout engines measure every label first, which costs more than
    # drawing (a report must stay fast on long runs).
    fig.subplots_adjust(**{"left": 0.08, "right": 0.98, "top": 0.9, "bottom": 0.1, "hspace": 0.45,
                           "wspace": 0.25, **margins})
    # A new file renamed into place: a symlink planted at `path` is replaced, never written through.
    write_atomic(path, lambda f: fig.savefig(f, dpi=DPI, format="png"))


def learning_curves(stage: str, rows: list[dict], keys: list[str], path: Path) -> dict:
    """One panel per metric: the raw batch values per step (thin) and smoothed; val_<key> as dots;
    probe_<key> (loop.probe_every: greedy, on fixed train items held out of training) as a line."""
    cols = min(3, len(keys))
    nrows = -(-len(keys) // cols)
    fig = Figure(figsize=(4.2 * cols, 2.6 * nrows))
    axes = np.atleast_1d(fig.subplots(nrows, cols)).ravel()
    series = {}
    for ax, key in zip(axes, keys):
        x, y = column(rows, key)
        ax.plot(x, y, lw=0.8, alpha=0.35, color="tab:blue", label="raw")
        ax.plot(x, smooth(y), lw=1.8, color="tab:blue", label="smoothed")
        series[key], series[f"{key} (smoothed)"] = (x, y), (x, smooth(y))
        vx, vy = column(rows, f"val_{key}")
        if len(vx):
            ax.plot(vx, vy, "o", ms=4, color="tab:red", label="val")
            series[f"val_{key}"] = (vx, vy)
        px, py = column(rows, f"probe_{key}")   # the same held-out train items every time: the policy alone moves it
        if len(px):
            ax.plot(px, py, "s-", ms=3, lw=1.2, color="tab:green", label="probe (greedy)")
            series[f"probe_{key}"] = (px, py)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[len(keys):]:
        ax.set_visible(False)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{stage}: learning curves", fontsize=10)
    _save(fig, path, top=1 - 0.55 / fig.get_figheight(), bottom=0.45 / fig.get_figheight(), hspace=0.6)
    return series


def op_mix(stage: str, rows: list[dict], path: Path) -> dict:
    """Stacked ADD / UPDATE / DELETE / NONE ops per completion over the steps."""
    names = ("ops_add", "ops_update", "ops_delete", "ops_none")
    steps = np.asarray([r["step"] for r in rows], dtype=float)
    ys = [np.asarray([float(r.get(k) or 0.0) for r in rows]) for k in names]
    fig = Figure(figsize=(7, 3.2))
    ax = fig.subplots()
    ax.stackplot(steps, *ys, labels=[k[4:].upper() for k in names], alpha=0.85)
    ax.set_xlabel("step")
    ax.set_ylabel("ops per completion")
    ax.set_title(f"{stage}: op mix of the sampled completions", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", ncols=4)
    _save(fig, path, bottom=0.15, left=0.09)
    return {k: (steps, y) for k, y in zip(names, ys)}


def step_time(stage: str, rows: list[dict], path: Path, max_staleness: int | None = None) -> dict:
    """Three panels: seconds per step stacked by phase (and the wall time), tokens/s per phase, and
    the staleness of each consumed rollout."""
    steps = np.asarray([r["step"] for r in rows], dtype=float)
    per = [phase_seconds(r) for r in rows]
    fig = Figure(figsize=(7.5, 7.5))
    ax_t, ax_r, ax_s = fig.subplots(3, 1, sharex=True)
    series = {}
    names = [n for n in PHASE_COLORS if any(p[n] > 0 for p in per)] or ["other"]
    ys = [np.asarray([p[n] for p in per]) for n in names]
    ax_t.stackplot(steps, *ys, labels=names, colors=[PHASE_COLORS[n] for n in names], alpha=0.85, step="mid")
    series.update({f"{n}_s": (steps, y) for n, y in zip(names, ys)})
    wx, wy = column(rows, "step_s")
    ax_t.plot(wx, wy, color="black", lw=1, label="wall")
    series["step_s"] = (wx, wy)
    ax_t.set_ylabel("seconds")
    ax_t.set_title(f"{stage}: time per step (generate and score overlap train when max_staleness > 0)",
                   fontsize=9)
    ax_t.legend(fontsize=7, ncols=4, loc="upper left")
    for label, num, den in (("generate", "response_tokens", "gen_s"), ("frozen answers", "frozen_tokens", "frozen_s"),
                            ("train (positions)", "positions", "train_s")):
        pts = [(r["step"], float(r[num]) / float(r[den])) for r in rows
               if isinstance(r.get(num), (int, float)) and isinstance(r.get(den), (int, float)) and r[den] > 0
               and r[num] > 0]
        if pts:
            x, y = map(np.asarray, zip(*pts))
            ax_r.plot(x, y, lw=1.2, label=label)
            series[f"tokens_per_s {label}"] = (x, y)
    if any(k.startswith("tokens_per_s") for k in series):
        ax_r.set_yscale("log")
        ax_r.legend(fontsize=7)
    ax_r.set_ylabel("tokens/s")
    sx, sy = column(rows, "staleness")
    ax_s.step(sx, sy, where="mid", color="tab:brown", label="staleness")
    if max_staleness is not None:
        ax_s.axhline(max_staleness, ls="--", color="gray", lw=1, label="bound")
    series["staleness"] = (sx, sy)
    ax_s.set_ylabel("versions")
    ax_s.set_xlabel("step")
    ax_s.legend(fontsize=7)
    _save(fig, path, top=0.95, bottom=0.07, left=0.11, hspace=0.2)
    return series


def _bars(ax, groups: list[str], bars: dict[str, list], title: str, ylabel: str) -> dict:
    """Grouped bars; `bars`: label -> one (value, low, high) per group (None: no bar)."""
    width = 0.8 / max(1, len(bars))
    x = np.arange(len(groups))
    series = {}
    for i, (label, cells) in enumerate(bars.items()):
        val = np.asarray([np.nan if c is None else c[0] for c in cells], dtype=float)
        lo = np.asarray([np.nan if c is None else c[0] - c[1] for c in cells], dtype=float)
        hi = np.asarray([np.nan if c is None else c[2] - c[0] for c in cells], dtype=float)
        pos = x - 0.4 + width * (i + 0.5)
        ax.bar(pos, np.nan_to_num(val), width, label=label, yerr=[np.nan_to_num(lo), np.nan_to_num(hi)],
               capsize=2, error_kw={"lw": 0.8})
        series[label] = (pos, val)
    ax.set_xticks(x, groups, fontsize=7)
    ax.axhline(0, color="black", lw=0.6)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.legend(fontsize=7)
    return series


def eval_categories(cells: dict[str, dict[str, dict]], path: Path) -> dict:
    """F1 and EM per category and overall for each eval report, with 95% bootstrap whiskers.
    `cells`: report -> metric -> category -> (mean, low, high) or None."""
    fig = Figure(figsize=(8, 5.5))
    axes = fig.subplots(2, 1)
    series = {}
    for ax, metric in zip(axes, ("f1", "em")):
        bars = {label: [m[metric].get(c) for c in CATEGORIES] for label, m in cells.items()}
        got = _bars(ax, list(CATEGORIES), bars, f"{metric.upper()} per category (95% bootstrap interval)", "points")
        series.update({f"{metric} {k}": v for k, v in got.items()})
    _save(fig, path, top=0.94, bottom=0.06, left=0.1, hspace=0.35)
    return series


def eval_deltas(cells: dict[str, dict[str, dict]], path: Path) -> dict:
    """Paired differences b - a per category and overall, with their bootstrap intervals.
    `cells`: "b - a" -> metric -> category -> (delta, low, high) or None."""
    fig = Figure(figsize=(8, 5.5))
    axes = fig.subplots(2, 1)
    series = {}
    for ax, metric in zip(axes, ("f1", "em")):
        bars = {name: [m[metric].get(c) for c in CATEGORIES] for name, m in cells.items()}
        got = _bars(ax, list(CATEGORIES), bars, f"paired {metric.upper()} difference (95% bootstrap interval)",
                    "points")
        series.update({f"{metric} {k}": v for k, v in got.items()})
    _save(fig, path, top=0.94, bottom=0.06, left=0.1, hspace=0.35)
    return series


def latency(reports: dict[str, dict], path: Path) -> dict:
    """Per role (manager call, search, answer): each report's latency samples as a box plot (ms, log
    scale); a report without samples shows its p50 and p95 as dots."""
    roles = ("manager", "search", "answer")
    fig = Figure(figsize=(9, 3.4))
    axes = fig.subplots(1, 3)
    series = {}
    labels = list(reports)
    for ax, role in zip(axes, roles):
        data, pos = [], []
        for i, label in enumerate(labels):
            lat = (reports[label].get("latency") or {}).get(role) or {}
            samples = np.asarray([v for v in lat.get("samples_s") or [] if v > 0], dtype=float) * 1e3
            if len(samples):
                data.append(samples)
                pos.append(i)
                series[f"{role} {label}"] = (np.full(len(samples), i), samples)
            elif lat.get("p50_s"):
                pts = np.asarray([lat["p50_s"], lat["p95_s"]], dtype=float) * 1e3
                ax.plot([i, i], pts, "o", color="tab:red")
                series[f"{role} {label} p50/p95"] = (np.asarray([i, i]), pts)
        if data:
            ax.boxplot(data, positions=pos, widths=0.6, showfliers=False)
        if data or any(k.startswith(role) for k in series):
            ax.set_yscale("log")
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=7)
        ax.set_xlim(-0.6, len(labels) - 0.4)
        ax.set_title({"manager": "manager call", "search": "search", "answer": "answer"}[role], fontsize=9)
        ax.set_ylabel("ms", fontsize=8)
    _save(fig, path, top=0.9, bottom=0.3, left=0.07, wspace=0.35)
    return series


def rollout_figures(rows: list[dict], seconds: dict[str, float], out_dir: Path) -> dict:
    """A rollout folder's two figures: the reward's distribution per op kind (the completions whose
    ops include it), and the seconds per phase. Returns {file name: the series drawn}."""
    kinds = {k: [r["reward"] for r in rows if k in (r["events"] or [])] for k in ("ADD", "UPDATE", "DELETE", "NONE")}
    kinds["parse_error"] = [r["reward"] for r in rows if r["status"] == "parse_error"]
    kinds = {k: v for k, v in kinds.items() if v} or {"all": [r["reward"] for r in rows]}
    fig = Figure(figsize=(7, 3.2))
    ax = fig.add_subplot()
    values = [v for vs in kinds.values() for v in vs]
    edges = np.histogram_bin_edges(values, bins=min(30, max(5, len(set(values)))))
    for k, v in kinds.items():
        ax.hist(v, bins=edges, histtype="step", density=True, label=f"{k} (n={len(v)})")
    ax.set_title("reward per op kind", fontsize=9)
    ax.set_xlabel("reward", fontsize=8)
    ax.legend(fontsize=7)
    _save(fig, out_dir / "reward_by_op.png", bottom=0.15)
    fig = Figure(figsize=(7, 2.6))
    ax = fig.add_subplot()
    names = list(seconds)
    ax.barh(names, [seconds[n] for n in names], color="tab:blue")
    ax.set_title("seconds per phase (all steps)", fontsize=9)
    _save(fig, out_dir / "phases.png", left=0.2)
    return {"reward_by_op.png": kinds, "phases.png": seconds}
