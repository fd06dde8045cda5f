"""rl.task.eval.stats: the bootstrap that resamples conversations is wider than the question-level one exactly
when questions of one conversation move together, keeps the pooled mean, and is what report
comparisons use."""
import numpy as np
import pytest

from memr1.rl.task.eval.stats import (ONE_CLUSTER, bootstrap_mean, compare_reports, format_comparison, paired_bootstrap,
                             paired_bootstrap_ratio)


def conversations(effect_sd: float, n_conv: int = 30, per_conv: int = 20, seed: int = 0):
    """Per-question (a, b) scores and conversation labels: b - a = a conversation's effect + noise."""
    rng = np.random.default_rng(seed)
    labels = np.repeat([f"conv-{i}" for i in range(n_conv)], per_conv)
    effect = np.repeat(rng.normal(0, effect_sd, n_conv), per_conv)
    a = rng.normal(50, 10, len(labels))
    return a, a + effect + rng.normal(0, 5, len(labels)), list(labels)


def width(r: dict) -> float:
    return r["ci_high"] - r["ci_low"]


def test_clustered_interval_is_wider_with_a_conversation_effect():
    a, b, labels = conversations(effect_sd=10)
    flat, clustered = paired_bootstrap(a, b), paired_bootstrap(a, b, clusters=labels)
    assert clustered["delta"] == pytest.approx(flat["delta"]) == pytest.approx(float(np.mean(b - a)))
    assert clustered["clusters"] == 30 and flat["clusters"] == 600
    assert width(clustered) > 2.5 * width(flat)
    assert clustered["ci_low"] < clustered["delta"] < clustered["ci_high"]


def test_without_a_conversation_effect_both_intervals_agree():
    a, b, labels = conversations(effect_sd=0)
    ratio = width(paired_bootstrap(a, b, clusters=labels)) / width(paired_bootstrap(a, b))
    assert 0.7 < ratio < 1.4


def test_unequal_clusters_keep_the_pooled_question_mean():
    a = np.zeros(11)
    b = np.array([1.0] * 10 + [0.0])            # one big conversation all right, one small one wrong
    labels = ["big"] * 10 + ["small"]
    r = paired_bootstrap(a, b, clusters=labels, resamples=4000)
    assert r["delta"] == pytest.approx(10 / 11)
    # drawing the small conversation twice gives 0; the big one twice gives 1; one of each 10/11
    assert r["ci_low"] == pytest.approx(0.0) and r["ci_high"] == pytest.approx(1.0)
    mean, lo, hi = bootstrap_mean(b, clusters=labels)
    assert mean == pytest.approx(10 / 11) and lo == pytest.approx(0.0) and hi == pytest.approx(1.0)
    with pytest.raises(ValueError, match="one label per item"):
        paired_bootstrap(a, b, clusters=labels[:-1])


def test_ratio_bootstrap_resamples_conversations_too():
    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(20), 10)
    den = np.ones(200)
    skill = np.repeat(rng.uniform(0, 1, 20), 10)            # conversations differ in how well b does
    num_a, num_b = rng.uniform(0, 1, 200) * 0.5, skill
    flat = paired_bootstrap_ratio(num_a, den, num_b, den)
    clustered = paired_bootstrap_ratio(num_a, den, num_b, den, clusters=labels)
    assert clustered["delta"] == pytest.approx(flat["delta"]) and width(clustered) > 1.5 * width(flat)


def test_compare_reports_clusters_by_conversation():
    a, b, labels = conversations(effect_sd=0.3, n_conv=12, per_conv=8)
    to01 = lambda x: (np.asarray(x) > 50).astype(float)
    rep = lambda scores: {"answers": [{"sample_id": s, "question": f"q{i}", "em": e, "f1": e, "bleu1": e}
                                      for i, (s, e) in enumerate(zip(labels, scores))]}
    ra, rb = rep(to01(a)), rep(to01(b + np.repeat(np.random.default_rng(3).normal(0, 30, 12), 8)))
    clustered, flat = compare_reports(ra, rb), compare_reports(ra, rb, cluster=False)
    assert clustered["em"]["clusters"] == 12 and flat["em"]["clusters"] == 96
    assert clustered["em"]["delta"] == pytest.approx(flat["em"]["delta"])
    assert width(clustered["em"]) > width(flat["em"])


def test_one_conversation_gives_no_interval_and_says_so():
    """Resampling one conversation draws it every time: a zero-width interval that looks certain."""
    a, b = np.zeros(12), np.array([1.0] * 9 + [0.0] * 3)
    one = ["conv-0"] * 12
    r = paired_bootstrap(a, b, clusters=one)
    assert (r["ci_low"], r["ci_high"], r["ci"]) == (None, None, ONE_CLUSTER)
    assert (r["n"], r["clusters"], r["a"], r["b"]) == (12, 1, 0.0, 0.75) and r["delta"] == pytest.approx(0.75)
    ratio = paired_bootstrap_ratio(a, np.ones(12), b, np.ones(12), clusters=one)
    assert (ratio["ci_low"], ratio["ci_high"], ratio["ci"], ratio["clusters"]) == (None, None, ONE_CLUSTER, 1)
    assert ratio["delta"] == pytest.approx(0.75)
    assert bootstrap_mean(b, clusters=one) == (0.75, None, None)
    flat = paired_bootstrap(a, b)   # unclustered: the item-level interval, as before
    assert 0 < flat["ci_low"] < flat["delta"] < flat["ci_high"] and "ci" not in flat
    assert bootstrap_mean(b)[1] is not None


def test_compare_reports_over_one_conversation_prints_no_interval(tmp_path):
    from memr1.engine.compare import format_summary
    from memr1.engine.observe import figures
    from memr1.engine.observe.report import delta_cells

    rep = lambda scores, hits: {
        "answers": [{"sample_id": "conv-26", "question": f"q{i}", "em": e, "f1": e, "bleu1": e, "category": 1}
                    for i, e in enumerate(scores)],
        "oracle": {"calls": [{"sample_id": "conv-26", "dia_ids": [f"D1:{i}"], "inter": h, "union": 1, "inter_ids": h,
                              "union_ids": 1} for i, h in enumerate(hits)]}}
    ra, rb = rep([0, 0, 1, 0, 0, 1], [0, 1, 0, 1]), rep([1, 1, 1, 0, 1, 1], [1, 1, 1, 1])
    rows = compare_reports(ra, rb)
    assert set(rows) == {"em", "f1", "bleu1", "op_accuracy", "op_accuracy_ids"}
    assert {m: (r["ci_low"], r["ci_high"], r["ci"]) for m, r in rows.items()} == dict.fromkeys(
        rows, (None, None, ONE_CLUSTER)) and rows["em"]["delta"] == pytest.approx(50.0)
    assert compare_reports(ra, rb, cluster=False)["em"]["ci_low"] is not None
    text = format_comparison(rows, "b - a")
    assert text.splitlines()[2].split()[:4] == ["em", "33.3", "83.3", "+50.0"] and ONE_CLUSTER in text
    summary = {"rows": {}, "comparisons": {"trained - base": rows}}
    assert f"em +50.0 {ONE_CLUSTER}" in format_summary(summary, "val")
    # the report's figure of paired differences takes the eval's interval for "overall": no whisker
    cells = delta_cells(ra, rb, rows, resamples=200)
    assert cells["em"]["overall"][0] == pytest.approx(50.0) and np.isnan(cells["em"]["overall"][1:]).all()
    figures.eval_deltas({"trained - base": cells}, tmp_path / "deltas.png")
    assert (tmp_path / "deltas.png").is_file()
