"""engine/validation.py with a scripted val score: which checkpoint each phase hands on when its
starting weights are scored too (loop.validate_start), and which val rollout scores each step."""
import json
from types import SimpleNamespace

from memr1.engine import validation
from memr1.engine.observe.report import by_stage

BOUNDS = [(0, 10), (10, 20)]   # two phases of 10 steps


class ScriptedVal:
    """A val stage whose greedy score is scripted per validation, in call order."""

    def __init__(self, scores):
        self.scores, self.steps = list(scores), []

    def rollout(self, step, policy):
        self.steps.append(step)
        return SimpleNamespace(metrics={"reward_mean": 0.0, "reward_em": self.scores.pop(0), "evidence_miss": 0.0})


def make(tmp_path, scores):
    run = SimpleNamespace(cfg=SimpleNamespace(reward=SimpleNamespace(kind="em"),
                                              episode=SimpleNamespace(max_evidence_miss=0.5)), world=1, rank=0)
    saved, val = [], ScriptedVal(scores)
    validate = validation.validator(run, val, None, tmp_path, saved.append, BOUNDS)
    return run, validate, val, saved


def best(tmp_path) -> dict:
    return json.loads((tmp_path / "best.json").read_text())


def test_a_phase_whose_steps_all_score_below_its_start_hands_its_start_on(tmp_path, monkeypatch):
    run, validate, val, saved = make(tmp_path, [0.6, 0.5, 0.4, 0.3, 0.3, 0.3])
    validate(0, 0)                      # the warm start
    validate(5)
    validate(10)
    assert best(tmp_path) == {"step": 0, "score": 0.6, "metric": "reward_em", "phase": 0, "evidence_miss": 0.0,
                              "start": True}
    loaded = []
    learner = SimpleNamespace(step=10, version=10)
    learner.continue_at = lambda step: vars(learner).update(step=step, version=step)
    monkeypatch.setattr(validation, "checkpoint", SimpleNamespace(load=lambda lrn, path: loaded.append(path)))
    monkeypatch.setattr(validation, "push_weights", lambda *a: None)
    assert validation.hand_on(run, tmp_path, 1, 10, learner, None, say=lambda *a: None)
    assert loaded == [str(tmp_path / "checkpoints" / "step_0")]   # the phase's start, not its last step
    validate(10, 1)                     # phase 1's start (phase 0's best) on phase 1's windows
    validate(15)                        # ties it: trained and no worse, so it replaces the start
    validate(20)                        # ties step 15: the first trained checkpoint of a tie stays
    assert saved == [0, 10, 15]
    assert best(tmp_path)["step"] == 15 and best(tmp_path)["phase"] == 1 and not best(tmp_path)["start"]
    # each validation scores its phase's windows: step s's weights on rollout s - 1, a phase's start on its first
    assert val.steps == [0, 4, 9, 10, 14, 19]


def test_a_phase_start_row_is_a_val_point_not_a_trained_step():
    rows = [{"stage": "m", "step": 0, "phase_start": True, "val_reward_em": 0.5},
            {"stage": "m", "step": 1, "reward_em": 0.2},
            {"stage": "m", "step": 1, "phase_start": True, "val_reward_em": 0.6}]
    got = by_stage(rows, ["m"])["m"]
    assert [r["step"] for r in got["rows"]] == [1] and "reward_em" in got["rows"][0]
    assert [r["step"] for r in got["starts"]] == [0, 1]
