"""Rollout generation: memr1's vLLM backend against transformers `generate` at its best CPU settings, on
the same prompts and the same outputs; and the weight-update cost of each memr1 backend.

    python -m memr1.bench.rollout [--quick] [--backends hf,vllm] [--hf-variants dynamic,static,static_compiled]
                                  [--kinds short,manager,answer] [--eager] [--model PATH] [--dtype bfloat16]
                                  [--new-tokens N] [--rounds N] --json PATH

Prompt kinds (bench/rollout_prompts.py): `short` (a lone question; 8 prompts x 4 samples, 64 new tokens)
and the real Memory-R1 `manager` and `answer` prompts at configs/default.toml's stage shapes (prompts per
step x group size, the role's token budget). Every round draws new prompts, and vLLM's prefix cache is
reset before every call, so no call reuses another's prefill; within a call vLLM still computes a
group's shared prompt once (a design difference the prefill column shows, not a cached shortcut).
Sampling is plain T=1 with EOS ignored, so both engines return the same number of tokens; each returns
token ids, the sampled tokens' log-probs and the text (bench/rollout_hf.py for the HF side).
Each round times, per engine, a 1-token call (prefill_s) and the full call; decode_s is their difference
in the same round. The engine order reverses every round; rows carry medians over rounds.
HF variants: dynamic cache, static cache, static cache with generate's torch.compile; one that fails on
this stack is recorded in `skipped` with its error. Update rows: a full-model update_weights of each
memr1 backend against a plain `copy_` of the same tensors onto the generator's device (the floor)."""
import argparse
import statistics
import time
from pathlib import Path

import torch

from memr1.bench.common import headline_entry, write_json
from memr1.bench.rollout_hf import VARIANTS, HFRunner
from memr1.bench.rollout_prompts import KINDS, prompt_sets
from memr1.engine.generation import make_generator, resolve_model
from memr1.engine.generation.config import GeneratorConfig
from memr1.engine.preload import preload
from memr1.rl.generation import SamplingConfig

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "default.toml"


def fp32_logprob_mad(ref, completions, temperature: float) -> float:
    """Mean abs difference between returned logprobs and log_softmax(logits / T) of an fp32 forward."""
    diffs = []
    for c in completions:
        get = c.get if isinstance(c, dict) else lambda k: getattr(c, k)
        prompt, toks = list(get("prompt_token_ids")), list(get("token_ids"))
        with torch.no_grad():
            logits = ref(torch.tensor([prompt + toks])).logits[0, len(prompt) - 1:-1].float()
        want = torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(toks)[:, None])[:, 0]
        diffs.append((want - torch.tensor(get("logprobs"))).abs())
    return torch.cat(diffs).mean().item()


class VLLMSide:
    """memr1's vLLM backend as the training stages call it (seed None: per-request seeds take vLLM's
    slower per-row sampling path, which training never uses)."""

    def __init__(self, gen, compiled: bool):
        self.gen, self.compiled = gen, compiled

    def settings(self) -> dict:
        return {"compiled": self.compiled, "dtype": str(self.gen.model_dtype).removeprefix("torch."),
                "prefix_cache": "on, reset before every call", "torch_threads": torch.get_num_threads()}

    def reset(self) -> None:
        self.gen.llm.reset_prefix_cache()

    def generate(self, prompts, n: int, max_new_tokens: int, seed: int) -> list:
        s = SamplingConfig(temperature=1.0, max_new_tokens=max_new_tokens, ignore_eos=True)
        return [c for row in self.gen.generate(prompts, n, s) for c in row]


def timed(engine, prompts, n: int, new_tokens: int, seed: int) -> tuple[float, list]:
    if hasattr(engine, "reset"):
        engine.reset()  # outside the timer: a fresh prefix cache, not a cost of generating
    t = time.perf_counter()
    out = engine.generate(prompts, n, new_tokens, seed)
    return time.perf_counter() - t, out


def bench_kind(kind: str, engines: dict, sets: list, n: int, new_tokens: int, rounds: int, ref, skipped: dict,
               model: str) -> list[dict]:
    """Rows of one prompt kind. sets[rounds] is the warm-up set, so no timed round sees a warmed prompt."""
    for name, engine in list(engines.items()):
        try:  # the first calls of a shape compile (vLLM's sampler, HF's compiled decode)
            timed(engine, sets[rounds], n, 1, 0)
            timed(engine, sets[rounds], n, new_tokens, 0)
        except Exception as e:  # an HF setting this stack cannot run is recorded as skipped; vLLM must run
            if not name.startswith("hf_"):
                raise
            skipped[name] = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
            print(f"  {name}: skipped ({skipped[name]})", flush=True)
            del engines[name]
    names = list(engines)
    pre, full, last = {k: [] for k in names}, {k: [] for k in names}, {}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            p, _ = timed(engines[name], sets[r], n, 1, r)
            f, out = timed(engines[name], sets[r], n, new_tokens, r)
            if any(len(c["token_ids"] if isinstance(c, dict) else c.token_ids) != new_tokens for c in out):
                raise AssertionError(f"{name} returned other than {new_tokens} tokens per row on {kind}")
            pre[name].append(p)
            full[name].append(f)
            last[name] = out
    rows = []
    lengths = [len(p) for s in sets[:rounds] for p in s]
    for name in names:
        rows_n = len(sets[0]) * n
        prefill = statistics.median(pre[name])
        decode = statistics.median(f - p for f, p in zip(full[name], pre[name]))
        total = statistics.median(full[name])
        rows.append({"engine": "vllm" if name == "vllm" else "hf", "variant": name, "prompt_kind": kind,
                     "model": model, "rounds": rounds, "prompts": len(sets[0]), "n": n, "rows": rows_n,
                     "prompt_tokens_mean": statistics.fmean(lengths), "prompt_tokens_max": max(lengths),
                     "new_tokens": new_tokens, "prefill_s": prefill, "decode_s": decode, "total_s": total,
                     "tokens_per_s": rows_n * new_tokens / total,
                     "prefill_tokens_per_s": rows_n * statistics.fmean(lengths) / prefill,
                     "decode_tokens_per_s": rows_n * (new_tokens - 1) / decode if decode > 0 else None,
                     "round_prefill_s": pre[name], "round_total_s": full[name],
                     "logprob_mad": fp32_logprob_mad(ref, last[name][:8], 1.0) if ref is not None else None,
                     "settings": engines[name].settings()})
    return rows


def hf_over_vllm(rows: list[dict]) -> dict:
    """Per kind: each HF variant's median seconds over vLLM's (total, prefill, decode); > 1 = vLLM faster."""
    out = {}
    for v in (r for r in rows if r.get("engine") == "vllm"):
        out[v["prompt_kind"]] = {h["variant"]: {k: h[k] / v[k] if v[k] > 0 else None
                                                for k in ("total_s", "prefill_s", "decode_s")}
                                 for h in rows if h.get("engine") == "hf" and h["prompt_kind"] == v["prompt_kind"]}
    return out


def headline(rows: list[dict]) -> list[dict]:
    """Per kind and HF variant: its total seconds over vLLM's (memr1's backend), prefill and decode beside;
    per backend: a plain copy_ of the weights over memr1's update (1.0: the update costs only the copy)."""
    gen = [headline_entry(f"{kind}: {variant} over vllm, seconds", r["total_s"], f"vllm {kind}", f"{variant} {kind}",
                          f"{variant}'s median total_s over vllm's on the same prompts and tokens",
                          prefill_ratio=r["prefill_s"], decode_ratio=r["decode_s"])
           for kind, variants in hf_over_vllm(rows).items() for variant, r in variants.items()]
    return gen + [headline_entry(f"{r['backend']}: weight update", r["copy_ms"] / r["update_ms"],
                                 f"{r['backend']} update_weights", f"copy_ onto {r['backend']}'s device",
                                 "a plain copy_ of the same tensors over memr1's update_weights (the floor is 1.0)",
                                 update_ms=r["update_ms"], copy_ms=r["copy_ms"])
                  for r in rows if "update_ms" in r]


def bench_update(gen, backend: str, reps: int, path: Path, model: str) -> dict:
    from safetensors.torch import load_file

    base = load_file(str(path / "model.safetensors"))
    torch.manual_seed(0)
    noisy = [(k, v + 1e-3 * torch.randn_like(v)) for k, v in base.items()]
    device = getattr(gen, "device", torch.device("cpu"))  # the HF backend's; vLLM's weights are its own
    floor = [torch.empty_like(v, device=device) for _, v in noisy]
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    manifest = {k: tuple(v.shape) for k, v in base.items()}
    update, copy = [], []
    for r in range(reps):
        t = time.perf_counter()
        # The loop's path: a stream checked against its manifest, each tensor dropped once loaded.
        gen.update_weights(iter(noisy if r % 2 == 0 else list(base.items())), version=r + 1, manifest=manifest)
        sync()
        update.append(time.perf_counter() - t)
        t = time.perf_counter()
        for dst, (_, src) in zip(floor, noisy):
            dst.copy_(src)
        sync()
        copy.append(time.perf_counter() - t)
    gen.update_weights(list(base.items()), version=reps + 1)
    # The first update of a vLLM engine pays one-off set-up; report the steady state as median.
    return {"backend": backend, "model": model, "update_ms": 1e3 * statistics.median(update),
            "copy_ms": 1e3 * statistics.median(copy), "first_update_ms": 1e3 * update[0]}


def shapes(kinds: list[str], quick: bool, new_tokens: int | None) -> tuple[dict, object]:
    """kind -> (prompts, n, new tokens): short fixed, manager and answer from configs/default.toml."""
    out, cfg = {}, None
    if "short" in kinds:
        out["short"] = (8, 4, 64)
    if {"manager", "answer"} & set(kinds):
        from memr1.engine.config.run import load_config
        cfg = load_config(DEFAULT_CONFIG)
        for role in ("manager", "answer"):
            stage = getattr(cfg.stage, role)
            out[role] = (stage.prompts_per_step, stage.group_size, getattr(cfg, role).max_new_tokens)
    out = {k: ((2, 2, 8) if quick else v) for k, v in out.items() if k in kinds}
    return {k: (p, g, new_tokens or t) for k, (p, g, t) in out.items()}, cfg


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 prompts x 2 samples, 8 new tokens, 3 rounds")
    p.add_argument("--backends", default="hf,vllm")
    p.add_argument("--hf-variants", default=",".join(VARIANTS))
    p.add_argument("--kinds", default="short,manager,answer")
    p.add_argument("--eager", action="store_true", help="vLLM without torch.compile: faster start, slower decode")
    p.add_argument("--model", default="default", help="'default' (converted SmolLM2) or a local HF checkpoint")
    p.add_argument("--dtype", default="auto", help="the generators' GeneratorConfig.dtype")
    p.add_argument("--new-tokens", type=int, default=None, help="override every kind's token budget")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 5; --quick 3)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.rounds is None:
        args.rounds = 3 if args.quick else 5
    kinds, variants = args.kinds.split(","), args.hf_variants.split(",")
    backends = [b for b in ("vllm", "hf") if b in args.backends.split(",")]
    if bad := [v for v in variants if v not in VARIANTS] + [k for k in kinds if k not in KINDS]:
        p.error(f"unknown HF variant or prompt kind: {bad}")
    if args.rounds < 3:
        p.error("--rounds must be at least 3 (a median needs them)")
    from transformers import AutoModelForCausalLM

    shape, cfg = shapes(kinds, args.quick, args.new_tokens)
    path = resolve_model(args.model)
    name = "SmolLM2-135M-Instruct" if args.model == "default" else path.name
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    gens = {}
    for backend in backends:
        print(f"{backend}: loading", flush=True)
        gens[backend] = make_generator(GeneratorConfig(backend=backend, model=str(args.model), dtype=args.dtype,
                                                       max_model_len=2048, enforce_eager=args.eager))
    tokenizer = next(iter(gens.values())).tokenizer
    sets = {k: prompt_sets(cfg, tokenizer, args.rounds + 1, shape[k][0], [k])[k] for k in kinds}
    # A static cache sized once per kind (its longest prompt plus the budget): one cache shape, so one
    # compiled graph per kind. transformers never shrinks it within a process, so the kinds run in
    # order of their cache length.
    cache_len = {k: max(len(q) for rs in sets[k] for q in rs) + shape[k][2] for k in kinds}
    engines = {"vllm": VLLMSide(gens["vllm"], not args.eager)} if "vllm" in gens else {}
    if "hf" in gens:  # the memr1 HF backend's model and tokenizer, driven as plain transformers
        engines.update({f"hf_{v}": HFRunner(gens["hf"].model, gens["hf"].tokenizer, v, 0) for v in variants})
    rows, skipped = [], {}
    for kind in sorted(kinds, key=cache_len.get):
        prompts, n, new_tokens = shape[kind]
        print(f"{kind}: {prompts} prompts x {n}, {new_tokens} new tokens", flush=True)
        for engine in engines.values():
            if isinstance(engine, HFRunner):
                engine.max_cache_len = cache_len[kind]
        rows += bench_kind(kind, engines, sets[kind], n, new_tokens, args.rounds, ref, skipped, name)
    rows += [bench_update(gen, backend, 3 if args.quick else 5, path, name) for backend, gen in gens.items()]
    print_table(rows, hf_over_vllm(rows), skipped)
    if args.json:
        settings = {"kinds": {k: dict(zip(("prompts", "n", "new_tokens"), v)) for k, v in shape.items()},
                    "rounds": args.rounds, "vllm_compiled": not args.eager, "hf_variants": variants,
                    "sampling": "T=1, top_p=1, top_k off, EOS ignored", "hf_max_cache_len": cache_len,
                    "config": str(DEFAULT_CONFIG) if cfg is not None else None}
        write_json(args.json, "rollout", rows, headline=headline(rows), skipped=skipped, settings=settings,
                   model=str(args.model), dtype=args.dtype, hf_device=str(gens["hf"].device) if "hf" in gens else None)
    return 0


def print_table(rows: list[dict], head: dict, skipped: dict) -> None:
    print(f"\n{'kind':8} {'variant':19} {'rows':>4} {'prompt':>6} {'new':>4} {'prefill_s':>9} {'decode_s':>9} "
          f"{'tok/s':>8} {'hf/vllm':>7} {'logprob_mad':>11}")
    for r in rows:
        if "prompt_kind" in r:
            ratio = head.get(r["prompt_kind"], {}).get(r["variant"], {}).get("total_s")
            print(f"{r['prompt_kind']:8} {r['variant']:19} {r['rows']:4d} {r['prompt_tokens_mean']:6.0f} "
                  f"{r['new_tokens']:4d} {r['prefill_s']:9.3f} {r['decode_s']:9.3f} {r['tokens_per_s']:8.1f} "
                  f"{'' if ratio is None else f'{ratio:.2f}':>7} {r['logprob_mad'] or float('nan'):11.2e}")
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    print(f"\n{'backend':8} {'update_ms':>9} {'copy_ms':>8} {'update/copy':>11} {'first_ms':>9}")
    for r in rows:
        if "update_ms" in r:
            print(f"{r['backend']:8} {r['update_ms']:9.1f} {r['copy_ms']:8.1f} "
                  f"{r['update_ms'] / r['copy_ms']:11.2f} {r['first_update_ms']:9.1f}")


if __name__ == "__main__":
    preload()  # tcmalloc + Intel OpenMP, as in production runs (engine/preload.py)
    raise SystemExit(main())
