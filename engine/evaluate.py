"""`memr1 eval`: build the generator, embedder and data from the run config, run `memr1.rl.eval`,
write `<run_dir>/eval/<split>.json` and print the paper's table.

Banks are cached under `eval.cache_dir`, else `$MEMR1_CACHE/eval`, else `<run_dir>/cache`, in a folder
named by a hash of everything that decides their content (model weights' identity, extraction and
manager settings, the embedder, the turn limit), so a rerun or an interrupted run reuses them.
"""
import hashlib
import json
import os
import sys
from pathlib import Path

import msgspec

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


def run_eval(cfg: RunConfig, split: str = "val", checkpoint: str | None = None) -> Path:
    from memr1.engine.generation import SamplingConfig, make_generator, resolve_model
    from memr1.rl.data import load_conversations
    from memr1.rl.eval import evaluate, table, write_report

    run_dir = cfg.resolved_run_dir()
    convs = load_conversations(cfg.data.path or None, cfg.data.n, cfg.data.seed, split=split)
    if not convs:
        source = cfg.data.path or f"the synthetic set (data.n={cfg.data.n})"
        raise ValueError(f"{source} has no conversations in split {split!r}")
    gen_cfg = cfg.generator
    if checkpoint:
        if cfg.eval.baseline == "base":
            raise ValueError("eval.baseline='base' evaluates the untrained model; drop --checkpoint")
        gen_cfg = msgspec.structs.replace(gen_cfg, model=str(Path(checkpoint).resolve()))
    model_path = resolve_model(gen_cfg.model)
    model_id = model_identity(model_path)
    embedder = make_embedder(cfg)
    generator = make_generator(gen_cfg)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=64, seed=cfg.seed)
    budget = gen_cfg.max_model_len

    def count_tokens(messages) -> int:
        text = generator.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return len(generator.tokenizer.encode(text, add_special_tokens=False))

    cache = bank_cache_dir(cfg, model_id, run_dir)
    report = evaluate(convs, split, generator, embedder, cfg.eval, sampling=greedy, cache_dir=cache,
                      model_id=model_id, extract_cfg=cfg.extract, manager_cfg=cfg.manager, answer_cfg=cfg.answer,
                      judge=make_judge(cfg, generator), count_tokens=count_tokens, context_limit=budget,
                      bank_overrides={"fsync": cfg.bank.fsync})
    report["data"] = cfg.data.path or f"synthetic(n={cfg.data.n}, seed={cfg.data.seed})"
    report["bank_cache"] = str(cache)
    out_dir = run_dir / "eval"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{split}.config.toml").write_text(dump_toml(cfg))
    out = write_report(report, out_dir / f"{split}.json")
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


def bank_cache_dir(cfg: RunConfig, model_id: str, run_dir: Path) -> Path:
    e = cfg.eval
    # Only what changes the banks' content goes into the key (not the answer or judge settings).
    key = {"model": model_id, "baseline_builds_banks": e.baseline in ("memr1", "base"),
           "embedder": cfg.embedder, "hash_dim": cfg.bank.hash_dim if cfg.embedder == "hash" else None,
           "extract": msgspec.to_builtins(cfg.extract), "manager": msgspec.to_builtins(cfg.manager),
           "dtype": cfg.generator.dtype, "backend": cfg.generator.backend,
           "eval": {k: getattr(e, k) for k in ("extract_max_new_tokens", "manager_max_new_tokens",
                                               "manager_turns_per_call", "extract_context_turns", "max_turns")}}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    root = Path(e.cache_dir) if e.cache_dir else (
        Path(os.environ["MEMR1_CACHE"]) / "eval" if os.environ.get("MEMR1_CACHE") else run_dir / "cache")
    return root / "banks" / digest
