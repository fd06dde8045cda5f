"""A synthetic run directory for `memr1 report`: config.toml, metrics.jsonl with every key the loop, the
stages and the learner log, eval reports of base / warm / trained with eval/summary.json, and a small
Chrome trace. `python tests/report_fixture.py DIR --steps 200` writes one to time the report on."""
import json
import random
import sys
from pathlib import Path

from memr1.engine.config.run import load_config
from memr1.engine.config.toml_out import dump_toml
from memr1.rl.task.eval.scoring import aggregate, percentiles

CATEGORIES = (1, 2, 3, 4)   # LoCoMo's numbering; rl/task/data/locomo.py names them


def manager_row(step: int, rng: random.Random, progress: float) -> dict:
    ops = [rng.uniform(0, 1) * (1 + progress) for _ in range(4)]
    em = min(1.0, 0.1 + 0.5 * progress + rng.uniform(-0.1, 0.1))
    return {"reward_mean": em - 0.2, "reward_em": em, "reward_format": -0.15, "reward_invalid_op": -0.05,
            "em_mean": em, "f1_mean": min(1.0, em + 0.1), "parse_failure_rate": max(0.0, 0.3 - 0.3 * progress),
            "invalid_rate": 0.05, "ops_add": ops[0], "ops_update": ops[1], "ops_delete": ops[2], "ops_none": ops[3],
            "capped_rate": 0.1, "frozen_capped_rate": 0.0, "frozen_answers": 64, "gen_s": rng.uniform(5, 7),
            "score_s": rng.uniform(1, 2), "response_tokens": 2000 + rng.randint(0, 500), "completions": 32,
            "forks": 32, "fork_s": 0.05, "frozen_s": 1.0, "bank_ops": 40 + rng.randint(0, 10), "frozen_tokens": 400}


def answer_row(step: int, rng: random.Random, progress: float) -> dict:
    em = min(1.0, 0.2 + 0.6 * progress + rng.uniform(-0.1, 0.1))
    return {"reward_mean": em - 0.05, "reward_em": em, "reward_format": -0.05, "em_mean": em,
            "f1_mean": min(1.0, em + 0.05), "parse_failure_rate": 0.1, "capped_rate": 0.05,
            "gen_s": rng.uniform(2, 3), "score_s": 0.01, "response_tokens": 600, "completions": 64}


def learner_row(rng: random.Random, staleness: int) -> dict:
    return {"loss": rng.uniform(-0.1, 0.1), "kl": 0.0, "nll": 1.2, "grad_norm": 0.5, "lr": 1e-5, "positions": 9000,
            "positions_per_s": 3000.0, "computed_frac": 1.0, "model_flops": 6 * 1.3e8 * 9000,
            "staleness": int(staleness), "train_s": rng.uniform(2, 3), "sync_s": 0.3, "sync_wait_s": 0.01,
            "idle_s": 0.5, "sleep_s": 0.0, "sync_bytes": 5.4e8}


def eval_report(label: str, gain: float, rng: random.Random, questions: int = 40) -> dict:
    answers = []
    for i in range(questions):
        score = float(rng.random() < 0.2 + gain)
        answers.append({"sample_id": f"conv-{i % 4}", "question": f"q{i}?", "gold": "a", "prediction": "a",
                        "category": CATEGORIES[i % 4], "f1": min(1.0, score + 0.1), "bleu1": score, "em": score,
                        "judge": None, "has_answer_tag": True, "capped": False, "memories_shown": 5})
    lat = {k: [rng.uniform(0.01, 0.2) for _ in range(questions)] for k in ("manager", "search", "answer")}
    return {"split": "val", "baseline": "base" if label == "base" else "memr1", "n_questions": questions,
            "n_conversations": 4, "metrics": aggregate(answers, judged=False),
            "capped": {"manager": {"calls": 10, "capped": 1, "rate": 0.1}, "answer": {"calls": questions, "capped": 0,
                                                                                      "rate": 0.0}},
            "latency": {k: percentiles(v) for k, v in lat.items()}, "manager": None, "oracle": None,
            "config": {"resamples": 200}, "answers": answers}


def chrome_trace() -> dict:
    """A profiled step's shape: two threads, named ranges, nested ops."""
    ev = lambda name, cat, ts, dur, tid: {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts,
                                          "dur": dur}
    return {"traceEvents": [
        ev("rollout", "user_annotation", 0, 900, 2), ev("generate", "user_annotation", 10, 600, 2),
        ev("aten::linear", "cpu_op", 20, 400, 2), ev("aten::addmm", "cpu_op", 30, 300, 2),
        ev("reward", "user_annotation", 700, 100, 2), ev("train_step", "user_annotation", 1000, 800, 1),
        ev("learner_forward", "user_annotation", 1010, 300, 1), ev("aten::mm", "cpu_op", 1020, 250, 1),
        ev("learner_backward", "user_annotation", 1320, 400, 1), ev("optimizer", "user_annotation", 1730, 60, 1),
        ev("weight_sync", "user_annotation", 1850, 100, 1), ev("weight_export", "user_annotation", 1860, 20, 1)]}


def make_run(root: Path, steps: int = 12, stages=("manager", "answer"), evals=("base", "warm", "trained"),
             crashed: bool = False, trace: bool = True, seed: int = 0) -> Path:
    """A run directory under `root`. `crashed`: the last stage stops half-way, its last line cut off,
    and no eval or trace is written."""
    rng = random.Random(seed)
    run = Path(root)
    run.mkdir(parents=True, exist_ok=True)
    over = [f"stages={list(stages)}", "loop.max_staleness=1", "profile.steps=[2]", f"eval_after={list(evals)}"]
    over += [f"stage.{s}.steps={steps}" for s in stages]
    (run / "config.toml").write_text(dump_toml(load_config(None, over)))
    lines = []
    for si, stage in enumerate(stages):
        last = steps // 2 if crashed and si == len(stages) - 1 else steps
        for step in range(1, last + 1):
            if stage == "manager" and step == 3:   # a rollout that failed with loop.on_rollout_error = "skip"
                lines.append(json.dumps({"step": 3, "stage": stage, "skipped": True, "error": "ValueError: boom"}))
                continue
            p = step / steps
            row = {**(manager_row if stage == "manager" else answer_row)(step, rng, p), **learner_row(rng, step > 1),
                   "step": step, "stage": stage, "weight_version": step}
            row["step_s"] = row["idle_s"] + row["train_s"] + row["sync_s"] + row["sync_wait_s"] + 0.05
            row["tokens_per_s"] = row["response_tokens"] / row["step_s"]
            if step % 5 == 0:
                row.update(val_reward_mean=row["reward_mean"], val_em_mean=row["em_mean"], val_f1_mean=row["f1_mean"])
            if step == 2:
                row["profiled"] = True
            lines.append(json.dumps(row))
    text = "\n".join(lines) + "\n"
    if crashed:
        text += lines[-1][: len(lines[-1]) // 2]   # a line cut off by the kill
    (run / "metrics.jsonl").write_text(text)
    if crashed:
        return run
    if evals:
        from memr1.engine.compare import summarize
        (run / "eval").mkdir(exist_ok=True)
        paths = {}
        for i, label in enumerate(evals):
            paths[label] = run / "eval" / f"val.{label}.json"
            paths[label].write_text(json.dumps(eval_report(label, 0.2 * i, random.Random(seed + i))))
        (run / "eval" / "summary.json").write_text(json.dumps(summarize(paths, 200, 0)))
    if trace:
        for stage in stages:
            (run / "profile" / stage).mkdir(parents=True, exist_ok=True)
            (run / "profile" / stage / "step_2.json").write_text(json.dumps(chrome_trace()))
    return run


if __name__ == "__main__":
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 200
    print(make_run(Path(sys.argv[1]), steps=steps))
