"""bench.headroom: oracle banks against ADD-every-fact banks under one reader, and the rule it settles."""
import json

import pytest

from memr1.bench import headroom


def report(ems: list[int]) -> dict:
    """An eval report of 4 conversations x len(ems)/4 questions; answer i scores ems[i]."""
    answers = [{"sample_id": f"c{i % 4}", "question": f"q{i}", "em": e, "f1": e, "bleu1": e} for i, e in enumerate(ems)]
    mean = 100 * sum(ems) / len(ems)
    return {"metrics": {"overall": {"em": mean, "f1": mean, "bleu1": mean}}, "answers": answers}


def make_run(tmp_path, name: str, oracle: list[int], add_all: list[int], data_seed: int):
    run = tmp_path / name
    (run / "eval").mkdir(parents=True)
    (run / "config.toml").write_text(f'eval_split = "test"\n\n[data]\nseed = {data_seed}\n')
    for label, ems in (("trained.oracle_banks", oracle), ("trained_answer.add_all_manager", add_all),
                       ("trained", add_all)):
        (run / "eval" / f"test.{label}.json").write_text(json.dumps(report(ems)))
    return run


def test_headroom_is_the_paired_difference_and_the_rule_reads_it(tmp_path):
    n = 40
    same = [i % 2 for i in range(n)]
    better = [1] * n                    # the oracle's banks answer everything: 50 points of headroom
    flat = [make_run(tmp_path, f"d{d}", same, same, d) for d in (0, 1)]
    rows = [r for run in flat for r in headroom.rows_of(run, resamples=200)]
    em = [r for r in rows if r["metric"] == "em"]
    assert [r["headroom"] for r in em] == [0.0, 0.0] and all(r["no_headroom"] for r in em)
    assert [r["data_seed"] for r in em] == [0, 1] and em[0]["control"] is None
    assert headroom.headline(rows)[-1]["value"] == 1.0          # no headroom at both data seeds
    wide = make_run(tmp_path, "d2", better, same, 2)
    got = [r for r in headroom.rows_of(wide, resamples=200) if r["metric"] == "em"][0]
    assert got["headroom"] == pytest.approx(100 * (sum(better) - sum(same)) / n) and not got["no_headroom"]
    assert headroom.headline(em + [got])[-1]["value"] == 0.0    # one seed with headroom: the rule fails
    assert headroom.headline(em[:1])[-1]["value"] == 0.0        # one data seed cannot settle it


def test_a_run_without_add_all_banks_is_named(tmp_path):
    run = make_run(tmp_path, "d0", [1, 0, 1, 0], [1, 0, 1, 0], 0)
    (run / "eval" / "test.trained_answer.add_all_manager.json").unlink()
    with pytest.raises(SystemExit, match="add_all"):
        headroom.rows_of(run)


def test_a_run_without_manager_rl_reports_its_warm_manager_and_names_the_reader(tmp_path):
    """A pre-registration run (configs/budget.toml: answer_warm, manager_warm, manager_control): its
    "trained" pipeline is the warm manager's, so the table must not call it trained."""
    run = make_run(tmp_path, "d0", [1, 0, 1, 1], [1, 0, 0, 0], 0)
    (run / "config.toml").write_text('eval_split = "test"\nstages = ["answer_warm", "manager_warm", "manager_control"]\n'
                                     '\n[data]\nseed = 0\n\n[stage.answer_warm]\nbanks = "mix"\n')
    em = [r for r in headroom.rows_of(run, resamples=50) if r["metric"] == "em"][0]
    assert em["trained"] is None and em["warm"] == 25.0 and em["reader"] == "answer_warm (mix banks)"
