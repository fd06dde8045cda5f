"""Paired comparisons of two policies on the same items, with seeded percentile-bootstrap intervals.

Both policies answer the same questions (or make the same manager calls), so the difference is taken
item by item and the items are resampled together: the interval reflects how much the difference
depends on which items happened to be in the split, not the two policies' separate spreads.
Ratio metrics (op accuracy = sum |O&P| / sum |O|P| over calls) are recomputed as ratios of the
resampled sums.
"""
import numpy as np

RESAMPLES = 2000


def paired_bootstrap(a, b, resamples: int = RESAMPLES, seed: int = 0, level: float = 0.95) -> dict:
    """Mean of b - a (points, when a and b are 0..1 scores x 100) and its bootstrap interval."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired_bootstrap: need two equally long 1-D lists, got {a.shape} and {b.shape}")
    if len(a) == 0:
        return {"n": 0, "a": None, "b": None, "delta": None, "ci_low": None, "ci_high": None}
    diff = b - a
    idx = np.random.default_rng(seed).integers(0, len(diff), size=(resamples, len(diff)))
    means = diff[idx].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return {"n": len(a), "a": float(a.mean()), "b": float(b.mean()), "delta": float(diff.mean()),
            "ci_low": float(lo), "ci_high": float(hi), "resamples": resamples, "seed": seed}


def bootstrap_mean(values, resamples: int = RESAMPLES, seed: int = 0, level: float = 0.95) -> tuple | None:
    """(mean, low, high): the mean of `values` and its percentile-bootstrap interval; None when empty."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or len(x) == 0:
        return None
    means = x[np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(x.mean()), float(lo), float(hi)


def paired_bootstrap_ratio(num_a, den_a, num_b, den_b, resamples: int = RESAMPLES, seed: int = 0,
                           level: float = 0.95) -> dict:
    """sum(num_b)/sum(den_b) - sum(num_a)/sum(den_a) over paired units, and its bootstrap interval."""
    arrays = [np.asarray(x, dtype=np.float64) for x in (num_a, den_a, num_b, den_b)]
    n = len(arrays[0])
    if any(x.shape != (n,) for x in arrays):
        raise ValueError("paired_bootstrap_ratio: need four equally long 1-D lists")
    if n == 0 or arrays[1].sum() == 0 or arrays[3].sum() == 0:
        return {"n": n, "a": None, "b": None, "delta": None, "ci_low": None, "ci_high": None}
    ratio = lambda num, den: num.sum(axis=-1) / np.maximum(den.sum(axis=-1), 1e-12)
    a, b = ratio(arrays[0], arrays[1]), ratio(arrays[2], arrays[3])
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    deltas = ratio(arrays[2][idx], arrays[3][idx]) - ratio(arrays[0][idx], arrays[1][idx])
    lo, hi = np.quantile(deltas, [(1 - level) / 2, 1 - (1 - level) / 2])
    return {"n": n, "a": float(a), "b": float(b), "delta": float(b - a), "ci_low": float(lo), "ci_high": float(hi),
            "resamples": resamples, "seed": seed}


def compare_reports(a: dict, b: dict, resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """Paired differences b - a (in points) between two eval reports of one split: EM, F1 and BLEU-1
    over the questions both answered, and op accuracy over the manager calls both made."""
    key = lambda r: (r["sample_id"], r["question"])
    theirs = {key(r): r for r in b.get("answers", [])}
    pairs = [(r, theirs[key(r)]) for r in a.get("answers", []) if key(r) in theirs]
    out = {}
    for metric in ("em", "f1", "bleu1"):
        out[metric] = paired_bootstrap([100 * x[metric] for x, _ in pairs], [100 * y[metric] for _, y in pairs],
                                       resamples, seed)
    ca, cb = ((o or {}).get("calls", []) for o in (a.get("oracle"), b.get("oracle")))
    ckey = lambda c: (c["sample_id"], tuple(c["dia_ids"]))
    calls_b = {ckey(c): c for c in cb}
    paired = [(c, calls_b[ckey(c)]) for c in ca if ckey(c) in calls_b]
    if paired:
        out["op_accuracy"] = paired_bootstrap_ratio([100 * x["inter"] for x, _ in paired], [x["union"] for x, _ in paired],
                                                    [100 * y["inter"] for _, y in paired], [y["union"] for _, y in paired],
                                                    resamples, seed)
    return out


def format_comparison(rows: dict[str, dict], title: str) -> str:
    """One line per metric: a, b, b - a and its 95% interval."""
    lines = [title, f"{'metric':12} {'a':>7} {'b':>7} {'b - a':>7}  95% CI            n"]
    for metric, r in rows.items():
        if r.get("delta") is None:
            lines.append(f"{metric:12} {'-':>7} {'-':>7} {'-':>7}  -  {r.get('n', 0):>14}")
            continue
        lines.append(f"{metric:12} {r['a']:7.1f} {r['b']:7.1f} {r['delta']:+7.1f}  [{r['ci_low']:+6.1f}, "
                     f"{r['ci_high']:+6.1f}] {r['n']:>5}")
    return "\n".join(lines)
