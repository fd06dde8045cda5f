"""Paired comparisons of two policies on the same items, with seeded percentile-bootstrap intervals.

Both policies answer the same questions (or make the same manager calls), so the difference is taken
item by item and the items are resampled together: the interval reflects how much the difference
depends on which items happened to be in the split, not the two policies' separate spreads.

Items are not independent: a conversation's questions share its speakers, its bank and its manager's
mistakes. Given `clusters` (one label per item, the conversation's id), the bootstrap resamples whole
conversations with replacement and keeps each one's items together; the statistic is the pooled mean
over the drawn items (sum of the drawn clusters' sums over their item counts). With a conversation
effect, this interval is wider than the item-level one, and it is the honest one. Without `clusters`
every item is its own cluster. Ratio metrics (op accuracy = sum |O&P| / sum |O|P| over calls) are
recomputed as ratios of the resampled sums.

With one conversation there is nothing to resample: every draw is that conversation, so the interval
would have zero width and look certain. Those results keep the point estimate and carry no interval
(`ci_low` = `ci_high` = None, `ci` = ONE_CLUSTER); the item-level interval (no `clusters`) stays available.
"""
import numpy as np

from memr1.rl.task.eval.scoring import OP_ACCURACY_VARIANTS

RESAMPLES = 2000
ONE_CLUSTER = "n/a (one conversation)"   # what a clustered interval over a single cluster prints


def _cluster_sums(columns: list[np.ndarray], clusters) -> list[np.ndarray]:
    """Per-cluster sums of each column (a cluster per item when `clusters` is None)."""
    if clusters is None:
        return columns
    labels = np.asarray([str(c) for c in clusters])
    if labels.shape != columns[0].shape:
        raise ValueError(f"clusters: need one label per item, got {labels.shape} for {columns[0].shape}")
    _, inverse = np.unique(labels, return_inverse=True)
    return [np.bincount(inverse, weights=c) for c in columns]


def _draws(n: int, resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def _interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.quantile(samples, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def _one_cluster(clusters, n_clusters: int) -> bool:
    """Clustering was asked for and all items share one cluster: no interval to give (module doc)."""
    return clusters is not None and n_clusters == 1


def ci_text(r: dict, fmt: str = "+.1f") -> str:
    """A result's interval as "[low, high]", or why it has none."""
    if r.get("ci_low") is None or r.get("ci_high") is None:
        return r.get("ci") or "-"
    return f"[{r['ci_low']:{fmt}}, {r['ci_high']:{fmt}}]"


def paired_bootstrap(a, b, resamples: int = RESAMPLES, seed: int = 0, level: float = 0.95, clusters=None) -> dict:
    """Mean of b - a (points, when a and b are 0..1 scores x 100) and its bootstrap interval,
    resampling `clusters` (one label per item) when given."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired_bootstrap: need two equally long 1-D lists, got {a.shape} and {b.shape}")
    if len(a) == 0:
        return {"n": 0, "a": None, "b": None, "delta": None, "ci_low": None, "ci_high": None}
    diff = b - a
    sums, counts = _cluster_sums([diff, np.ones_like(diff)], clusters)
    out = {"n": len(a), "clusters": len(sums), "a": float(a.mean()), "b": float(b.mean()), "delta": float(diff.mean())}
    if _one_cluster(clusters, len(sums)):
        return out | {"ci_low": None, "ci_high": None, "ci": ONE_CLUSTER}
    idx = _draws(len(sums), resamples, seed)
    lo, hi = _interval(sums[idx].sum(axis=1) / counts[idx].sum(axis=1), level)
    return out | {"ci_low": lo, "ci_high": hi, "resamples": resamples, "seed": seed}


def bootstrap_mean(values, resamples: int = RESAMPLES, seed: int = 0, level: float = 0.95,
                   clusters=None) -> tuple | None:
    """(mean, low, high): the mean of `values` and its percentile-bootstrap interval; None when empty;
    low and high None when `clusters` holds one cluster (module doc)."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or len(x) == 0:
        return None
    sums, counts = _cluster_sums([x, np.ones_like(x)], clusters)
    if _one_cluster(clusters, len(sums)):
        return float(x.mean()), None, None
    idx = _draws(len(sums), resamples, seed)
    lo, hi = _interval(sums[idx].sum(axis=1) / counts[idx].sum(axis=1), level)
    return float(x.mean()), lo, hi


def paired_bootstrap_ratio(num_a, den_a, num_b, den_b, resamples: int = RESAMPLES, seed: int = 0,
                           level: float = 0.95, clusters=None) -> dict:
    """sum(num_b)/sum(den_b) - sum(num_a)/sum(den_a) over paired units, and its bootstrap interval."""
    arrays = [np.asarray(x, dtype=np.float64) for x in (num_a, den_a, num_b, den_b)]
    n = len(arrays[0])
    if any(x.shape != (n,) for x in arrays):
        raise ValueError("paired_bootstrap_ratio: need four equally long 1-D lists")
    if n == 0 or arrays[1].sum() == 0 or arrays[3].sum() == 0:
        return {"n": n, "a": None, "b": None, "delta": None, "ci_low": None, "ci_high": None}
    ratio = lambda num, den: num.sum(axis=-1) / np.maximum(den.sum(axis=-1), 1e-12)
    a, b = ratio(arrays[0], arrays[1]), ratio(arrays[2], arrays[3])
    sums = _cluster_sums(arrays, clusters)
    out = {"n": n, "clusters": len(sums[0]), "a": float(a), "b": float(b), "delta": float(b - a)}
    if _one_cluster(clusters, len(sums[0])):
        return out | {"ci_low": None, "ci_high": None, "ci": ONE_CLUSTER}
    idx = _draws(len(sums[0]), resamples, seed)
    lo, hi = _interval(ratio(sums[2][idx], sums[3][idx]) - ratio(sums[0][idx], sums[1][idx]), level)
    return out | {"ci_low": lo, "ci_high": hi, "resamples": resamples, "seed": seed}


def compare_reports(a: dict, b: dict, resamples: int = RESAMPLES, seed: int = 0, cluster: bool = True) -> dict:
    """Paired differences b - a (in points) between two eval reports of one split: EM, F1 and BLEU-1
    over the questions both answered, and op accuracy over the manager calls both made (see
    rl/task/eval/scoring.py for its variants). With `cluster`, conversations are resampled (module doc)."""
    key = lambda r: (r["sample_id"], r["question"])
    theirs = {key(r): r for r in b.get("answers", [])}
    pairs = [(r, theirs[key(r)]) for r in a.get("answers", []) if key(r) in theirs]
    groups = [x["sample_id"] for x, _ in pairs] if cluster else None
    out = {}
    for metric in ("em", "f1", "bleu1"):
        out[metric] = paired_bootstrap([100 * x[metric] for x, _ in pairs], [100 * y[metric] for _, y in pairs],
                                       resamples, seed, clusters=groups)
    ca, cb = ((o or {}).get("calls", []) for o in (a.get("oracle"), b.get("oracle")))
    ckey = lambda c: (c["sample_id"], tuple(c["dia_ids"]))
    calls_b = {ckey(c): c for c in cb}
    paired = [(c, calls_b[ckey(c)]) for c in ca if ckey(c) in calls_b]
    for name, inter, union, keep in OP_ACCURACY_VARIANTS:
        chosen = [(x, y) for x, y in paired if inter in x and inter in y and keep(x)]
        if chosen:
            out[name] = paired_bootstrap_ratio(
                [100 * x[inter] for x, _ in chosen], [x[union] for x, _ in chosen],
                [100 * y[inter] for _, y in chosen], [y[union] for _, y in chosen], resamples, seed,
                clusters=[x["sample_id"] for x, _ in chosen] if cluster else None)
    return out


def format_comparison(rows: dict[str, dict], title: str) -> str:
    """One line per metric: a, b, b - a and its 95% interval."""
    w = len(ONE_CLUSTER)
    lines = [title, f"{'metric':22} {'a':>7} {'b':>7} {'b - a':>7}  {'95% CI':{w}} {'n':>5}"]
    for metric, r in rows.items():
        if r.get("delta") is None:
            lines.append(f"{metric:22} {'-':>7} {'-':>7} {'-':>7}  {'-':{w}} {r.get('n', 0):>5}")
            continue
        lines.append(f"{metric:22} {r['a']:7.1f} {r['b']:7.1f} {r['delta']:+7.1f}  {ci_text(r, '+6.1f'):{w}} "
                     f"{r['n']:>5}")
    return "\n".join(lines)
