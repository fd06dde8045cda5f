"""`memr1 eval`: build the generator, embedder and data from the run config, run `memr1.rl.eval`,
write `<run_dir>/eval/<split>.json` and print the paper's table.

Extractions and banks are cached under `eval.cache_dir`, else `$MEMR1_CACHE/eval`, else
`<run_dir>/cache`, in folders named by a hash of everything that decides their content (the weights'
identity, extraction and manager settings, the embedder, the turn limit), so a rerun or an
interrupted run reuses them. One engine serves every role, swapping checkpoints between phases.
"""
import hashlib
import json
import os
import sys
from pathlib import Path

import msgspec

from memr1.engine.checkpoint import latest_checkpoint
from memr1.engine.config import ConfigError, RunConfig, dump_toml, load_config, make_embedder


def eval_cli(args) -> int:
    try:
        cfg = load_config(args.config, list(getattr(args, "overrides", None) or []))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        out = run_eval(cfg, split=args.split, checkpoint=getattr(args, "checkpoint", None))
    except (ValueError, FileNotFoundError, ImportError) as e:   # bad data path, empty split, bad checkpoint
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


def role_models(base: Path, checkpoint: str | None) -> dict[str, Path]:
    """Which weights play which role. Extraction and the local judge always use the base model (they
    are not trained); the manager and the answer agent use `checkpoint`, which is either one HF
    checkpoint (both roles) or a `memr1 train` run directory (each stage's latest checkpoint, the base
    model for a stage that has none)."""
    roles = {"extract": base, "manager": base, "answer": base, "judge": base}
    if not checkpoint:
        return roles
    path = Path(checkpoint)
    if (path / "config.json").is_file():
        return {**roles, "manager": path, "answer": path}
    if (path / "config.toml").is_file():
        found = {stage: latest_checkpoint(path / stage) for stage in ("manager", "answer")}
        if not any(found.values()):
            raise ValueError(f"--checkpoint {path}: a run directory without any checkpoint yet")
        return {**roles, **{stage: p for stage, p in found.items() if p is not None}}
    raise ValueError(f"--checkpoint {path}: no config.json (HF checkpoint) or config.toml (run directory) there")


def run_eval(cfg: RunConfig, split: str = "val", checkpoint: str | None = None, generator=None,
             label: str = "") -> Path:
    """Evaluate one split; write `<run_dir>/eval/<split>[.<label>].json` and print the table.
    `generator`: an engine to reuse (its current weights don't matter: each role loads its own)."""
    from memr1.engine.generation import SamplingConfig, make_generator, resolve_model
    from memr1.engine.swap import WeightSwap
    from memr1.rl.data import load_conversations
    from memr1.rl.eval import evaluate, table, write_report

    run_dir = cfg.resolved_run_dir()
    convs = load_conversations(cfg.data.path or None, cfg.data.n, cfg.data.seed, split=split)
    if not convs:
        source = cfg.data.path or f"the synthetic set (data.n={cfg.data.n})"
        raise ValueError(f"{source} has no conversations in split {split!r}")
    if checkpoint and cfg.eval.baseline == "base":
        raise ValueError("eval.baseline='base' evaluates the untrained model; drop --checkpoint")
    base = resolve_model(cfg.generator.model)
    models = role_models(base, checkpoint)
    ids = {role: model_identity(path) for role, path in models.items()}
    embedder = make_embedder(cfg)
    if generator is None:
        generator = make_generator(cfg.generator)
        swap = WeightSwap(generator, loaded=base)
    else:
        swap = WeightSwap(generator)
    views = {role: swap.view(path) for role, path in models.items()}
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=64, seed=cfg.seed)
    budget = cfg.generator.max_model_len

    def count_tokens(messages) -> int:
        text = generator.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return len(generator.tokenizer.encode(text, add_special_tokens=False))

    facts_dir, banks_dir = cache_dirs(cfg, ids, run_dir)
    report = evaluate(convs, split, views, embedder, cfg.eval, sampling=greedy, cache_dir=banks_dir,
                      facts_dir=facts_dir, model_id=ids["answer"], extract_cfg=cfg.extract,
                      manager_cfg=cfg.manager, answer_cfg=cfg.answer, judge=make_judge(cfg, views["judge"]),
                      count_tokens=count_tokens, context_limit=budget, bank_overrides={"fsync": cfg.bank.fsync})
    report["data"] = cfg.data.path or f"synthetic(n={cfg.data.n}, seed={cfg.data.seed})"
    report["models"], report["weight_swaps"] = ids, swap.swaps
    report["bank_cache"], report["facts_cache"] = str(banks_dir), str(facts_dir)
    out_dir = run_dir / "eval"
    out_dir.mkdir(parents=True, exist_ok=True)
    name = f"{split}.{label}" if label else split
    (out_dir / f"{name}.config.toml").write_text(dump_toml(cfg))
    out = write_report(report, out_dir / f"{name}.json")
    print(table(report))
    m = report["manager"]
    if m:
        print(f"manager: {m['calls']} calls, {m['turns_per_call']} turn(s) per call, events {m['events']}")
    if report["oracle"]:
        o = report["oracle"]
        print(f"oracle: op accuracy {_pct(o['op_accuracy'])}, fact recall {_pct(o['fact_recall'])}, "
              f"fact precision {_pct(o['fact_precision'])}")
    for s in report["skipped"]:
        print(f"skipped {s['sample_id']} ({s['questions']} questions): {s['reason']}")
    print(f"wall {report['wall_s']:.1f} s")
    return out


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def make_judge(cfg: RunConfig, generator):
    if cfg.eval.judge == "off":
        return None
    if cfg.eval.judge == "local":
        return generator
    from memr1.rl.judge import OpenAIChatGenerator
    return OpenAIChatGenerator(cfg.eval.judge_url, cfg.eval.judge_model, os.environ.get(cfg.eval.judge_api_key_env))


def model_identity(path: Path) -> str:
    """Names the weights, not the folder: the converted default carries the GGUF digest, any other
    checkpoint is named by its path and its weight files' sizes and mtimes."""
    marker = path / "source.sha256"
    if marker.is_file():
        return f"{path.name}@{marker.read_text().split()[0][:16]}"
    files = sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin"))
    stamp = [(f.name, f.stat().st_size, int(f.stat().st_mtime)) for f in files]
    return f"{path.resolve()}@{hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:16]}"


def cache_keys(cfg: RunConfig, ids: dict[str, str]) -> tuple[str, str]:
    """(extraction key, bank key). Each holds only what changes that content, so the trained eval of a
    run reuses the base eval's extraction (both extract with the base model), and stage 2 of
    `memr1 train` rebuilds its banks only when something that shapes them changed."""
    e = cfg.eval
    common = {"embedder": cfg.embedder, "hash_dim": cfg.bank.hash_dim if cfg.embedder == "hash" else None,
              "dtype": cfg.generator.dtype, "backend": cfg.generator.backend,
              "turns": {k: getattr(e, k) for k in ("extract_context_turns", "max_turns")}}
    facts_key = {**common, "model": ids["extract"], "extract": msgspec.to_builtins(cfg.extract),
                 "max_new_tokens": e.extract_max_new_tokens}
    facts_digest = _digest(facts_key)
    bank_key = {"facts": facts_digest, "model": ids["manager"], "manager": msgspec.to_builtins(cfg.manager),
                "baseline_builds_banks": e.baseline in ("memr1", "base"),
                "eval": {k: getattr(e, k) for k in ("manager_max_new_tokens", "manager_turns_per_call")}}
    return facts_digest, _digest(bank_key)


def cache_dirs(cfg: RunConfig, ids: dict[str, str], run_dir: Path) -> tuple[Path, Path]:
    """(extraction cache, bank cache) folders, under eval.cache_dir, $MEMR1_CACHE/eval or the run."""
    e = cfg.eval
    facts_key, bank_key = cache_keys(cfg, ids)
    root = Path(e.cache_dir) if e.cache_dir else (
        Path(os.environ["MEMR1_CACHE"]) / "eval" if os.environ.get("MEMR1_CACHE") else run_dir / "cache")
    return root / "facts" / facts_key, root / "banks" / bank_key


def _digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
