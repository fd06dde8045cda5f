"""One split evaluated with given checkpoints: build the generator, embedder and data from the run
config, run `memr1.rl.task.eval.evaluation`, write `<run_dir>/eval/<split>[.<label>].json` and print the paper's
table. `memr1 eval` runs it once; the end of `memr1 train` (compare.py) once per policy.

Extractions and banks are cached under `cache_dir`, else `$MEMR1_CACHE/eval`, else
`<run_dir>/cache`, keyed by what decides their content (config/caches.py), so a rerun or an
interrupted run reuses them, and memr1 train's items reuse an eval's extraction. One engine serves
every role, swapping checkpoints between phases.
"""
from pathlib import Path

import msgspec

from memr1.engine.config.caches import cache_dirs, model_identity
from memr1.engine.config.judge import make_judge
from memr1.engine.config.resolve import Resolved
from memr1.engine.config.run import make_embedder, make_run_dir
from memr1.engine.config.toml_out import dump_toml
from memr1.engine.observe import quiet

ROLES = ("extract", "manager", "answer", "judge")


def run_eval(run: Resolved, split: str = "val", models: dict | None = None, generator=None,
             label: str = "", baseline: str | None = None) -> Path:
    """Evaluate one split; write `<run_dir>/eval/<split>[.<label>].json` and print the table.
    `models`: role -> checkpoint for the manager and/or the answer agent (others: the base model);
    `generator`: an engine to reuse (its current weights don't matter: each role loads its own)."""
    from memr1.engine.generation import make_generator
    from memr1.engine.generation.swap import WeightSwap
    from memr1.rl.task.data import load_configured
    from memr1.rl.task.eval.evaluation import evaluate, table, write_report

    cfg, run_dir, base = run.cfg, run.run_dir, run.base_model
    ecfg = cfg.eval if baseline is None else msgspec.structs.replace(cfg.eval, baseline=baseline)
    make_run_dir(run_dir)
    quiet.log_to(run_dir)
    convs = load_configured(cfg.data, split)
    if not convs:
        source = cfg.data.path or f"the {cfg.data.kind} set (data.n={cfg.data.n}, data.seed={cfg.data.seed})"
        raise ValueError(f"{source} has no conversations in split {split!r}")
    if models and ecfg.baseline == "base":
        raise ValueError("eval.baseline='base' evaluates the untrained model; drop the checkpoints")
    paths = {**dict.fromkeys(ROLES, base), **(models or {})}
    ids = {role: model_identity(p) for role, p in paths.items()}
    embedder = make_embedder(cfg)
    if generator is None:
        generator = make_generator(cfg.generator, cfg.seed)
        swap = WeightSwap(generator, loaded=base)
    else:
        swap = WeightSwap(generator)
    views = {role: swap.view(p) for role, p in paths.items()}

    def count_tokens(messages) -> int:
        text = generator.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return len(generator.tokenizer.encode(text, add_special_tokens=False))

    facts_dir, banks_dir = cache_dirs(cfg, ids, ecfg.max_turns)
    judge = make_judge(cfg, views["judge"])
    report = evaluate(convs, split, views, embedder, ecfg, task=run.task,
                      cache_dir=banks_dir, facts_dir=facts_dir, model_id=ids["answer"], judge=judge,
                      count_tokens=count_tokens, context_limit=cfg.generator.max_model_len,
                      bank_overrides={"fsync": cfg.bank.fsync}, batch_size=cfg.generator.batch_size)
    report["data"] = cfg.data.path or f"{cfg.data.kind}(n={cfg.data.n}, seed={cfg.data.seed})"
    report["models"], report["weight_swaps"] = ids, swap.swaps
    report["bank_cache"], report["facts_cache"] = str(banks_dir), str(facts_dir)
    out_dir = run_dir / "eval"
    out_dir.mkdir(parents=True, exist_ok=True)
    name = f"{split}.{label}" if label else split
    (out_dir / f"{name}.config.toml").write_text(dump_toml(cfg))
    out = write_report(report, out_dir / f"{name}.json")
    print(table(report))
    if report["manager"]:
        m = report["manager"]
        print(f"manager: {m['calls']} calls, {m['turns_per_call']} turn(s) per call, events {m['events']}")
    if report["oracle"]:
        o = report["oracle"]
        print(f"oracle: op accuracy {_pct(o['op_accuracy'])}, fact recall {_pct(o['fact_recall'])}, "
              f"fact precision {_pct(o['fact_precision'])}")
    for s in report["skipped"]:
        print(f"skipped {s['sample_id']} ({s['questions']} questions): {s['reason']}")
    inp = report["input"]
    if inp.get("empty_speaker_skipped"):
        print(f"warning: {inp['empty_speaker_skipped']} of {inp['turns']} turns have no speaker and were left out")
    if inp.get("long_turns_split"):
        from memr1.rl.task.rag import MAX_TEXT_BYTES
        print(f"warning: {inp['long_turns_split']} of {inp['turns']} turns are longer than a memory "
              f"({MAX_TEXT_BYTES} bytes) and were split into several")
    print(f"wall {report['wall_s']:.1f} s")
    return out


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"
