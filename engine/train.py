"""`memr1 train`: both Memory-R1 stages through the one loop, into a run directory.

runs/<name>/config.toml            the resolved config
runs/<name>/metrics.jsonl          one JSON object per step (both stages)
runs/<name>/tb/                    TensorBoard
runs/<name>/<stage>/checkpoints/step_<N>/   HF-loadable policy + optimizer, RNG and data state
runs/<name>/answer/banks/          stage 2's banks, built by the frozen stage-1 manager
runs/<name>/eval/<split>.json       with `eval_after`: the trained policies (<split>.base.json: the base)
Stage 2 (answer) runs after stage 1 (manager) and, with items.answer_banks = "manager", trains on banks
that stage 1's final checkpoint built (or items.manager_checkpoint's, or the base model's).

Data parallel (`torchrun --nproc_per_node N -m memr1.engine.cli train ...`): the process group is joined
first, so each rank's engines join it (vLLM's external_launcher). Each rank rolls out its contiguous 1/N
of every step's prompts (stage.prompts_per_step must divide by N); the loop all-gathers the rollouts in
rank order into the global batch, of which every FSDP rank trains its share. Only rank 0 writes
config.toml, metrics.jsonl, tb/, the progress bars and prints; checkpoints are collective saves that
rank 0 writes. Stage-2 banks: each rank builds the banks its own slice draws, in its own folder
(answer/banks/<key>/rank<r>/): one writer per bank, no cross-rank wait around a long build. eval_after
runs on rank 0 alone; the other ranks return once training is done (torchrun waits for rank 0), rather
than wait at a barrier that a long eval would time out.
"""
import dataclasses
import json
import time
from pathlib import Path

import msgspec
from tqdm import tqdm

from memr1.engine import dist as dist_utils
from memr1.engine.config import ConfigError, RunConfig, dump_toml, load_config, make_embedder
from memr1.engine.checkpoint import latest_checkpoint
from memr1.engine.generation import SamplingConfig, make_generator, resolve_model
from memr1.engine.learner import Learner
from memr1.engine.loop import Loop, no_gather
from memr1.engine.plan import plan_text
from memr1.engine.stages import AnswerStage, ManagerStage, rank_items, world_problem


class RunLog:
    """metrics.jsonl + TensorBoard + a progress bar, fed one metrics dict per step."""

    def __init__(self, run_dir: Path, stage: str, total: int, start: int):
        from torch.utils.tensorboard import SummaryWriter

        self.file = open(run_dir / "metrics.jsonl", "a")
        self.tb = SummaryWriter(str(run_dir / "tb" / stage))
        self.bar = tqdm(total=total, initial=start, desc=f"train {stage}", unit="step", dynamic_ncols=True)

    def __call__(self, m: dict) -> None:
        m = {k: (v.item() if hasattr(v, "item") else v) for k, v in m.items()}  # 0-d tensors -> numbers
        if "response_tokens" in m and m.get("step_s"):
            m["tokens_per_s"] = m["response_tokens"] / m["step_s"]
        self.file.write(json.dumps(m) + "\n")
        self.file.flush()
        for k, v in m.items():
            if isinstance(v, (int, float)) and k != "step":
                self.tb.add_scalar(f"{m['stage']}/{k}", v, m["step"])
        self.bar.set_postfix(reward=f"{m.get('reward_mean', float('nan')):.3f}",
                             tok_s=f"{m.get('tokens_per_s', 0):.0f}", stale=m.get("staleness", 0))
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
        self.tb.close()
        self.file.close()


def sync_policy(policy, learner, version: int, cfg: RunConfig) -> None:
    """Put the learner's weights into the policy engine: at a stage's start (fresh or resumed) the
    engine may still hold the previous stage's policy."""
    named = (p for bucket in learner.export_weights(cfg.loop.weight_bucket_mb << 20) for p in bucket)
    policy.update_weights(named, version, manifest=learner.weight_manifest())


def train_stage(cfg: RunConfig, name: str, items: list, embedder, run_dir: Path, policy, frozen) -> Path:
    stage_dir = run_dir / name
    base = str(resolve_model(cfg.generator.model))
    learner = Learner(msgspec.structs.replace(cfg.learner, model_path=base, temperature=cfg.sampling.temperature))
    rank, world = learner.d.rank, learner.d.world
    start = 0
    ckpt = latest_checkpoint(stage_dir)
    if ckpt is not None:  # resume: same data order (items are picked by step), same weights
        state = learner.load_checkpoint(str(ckpt))
        start = int(state.get("data", {}).get("step", state.get("step", 0)))
        if rank == 0:
            print(f"resuming {name} from {ckpt} at step {start}")
    sync_policy(policy, learner, start, cfg)
    if name == "manager":  # the frozen Answer Agent answers from each rollout's fork, on base weights
        stage = ManagerStage(items, frozen, embedder, cfg.stage, cfg.sampling, cfg.manager, cfg.answer, rank, world)
    else:
        stage = AnswerStage(items, embedder, cfg.stage, cfg.sampling, cfg.answer, rank, world)
    log = RunLog(run_dir, name, cfg.loop.steps, start) if rank == 0 else None

    def save(step: int) -> None:
        learner.save_checkpoint(str(stage_dir), {"step": step})

    try:
        Loop(stage, policy, learner, cfg.loop, on_step=log or (lambda m: None), save_checkpoint=save,
             gather=dist_utils.gather_rollouts if world > 1 else no_gather).run(start)
    finally:
        if log is not None:
            log.close()
        del learner
    return latest_checkpoint(stage_dir)


def manager_banks(cfg: RunConfig, conversations: list, answer_items: list, embedder, swap, manager: Path,
                  run_dir: Path, rank: int = 0, world: int = 1) -> list:
    """Stage 2's banks, built by the frozen stage-1 manager with the eval pipeline (rl/eval_banks.py)
    and cached in the run. Facts come from the synthetic oracle when there is one (a perfect
    extractor), else from extraction with the base model. Only the conversations that stage 2's steps
    will draw from are built (the draw is fixed by step, so a resume builds the same set); under data
    parallelism, those this rank's slices draw, in the rank's own folder."""
    from memr1.engine.evaluate import cache_keys, model_identity
    from memr1.rl.eval_banks import extract_all, oracle_facts, run_manager, with_tokens

    need = {it.conversation for s in range(cfg.loop.steps)
            for it in rank_items(answer_items, s, cfg.stage.prompts_per_step, rank, world)}
    convs = [c for c in conversations if c.sample_id in need]
    base = resolve_model(cfg.generator.model)  # extraction runs on the base model
    ids = {"extract": model_identity(base), "manager": model_identity(manager)}
    root = run_dir / "answer" / "banks" / cache_keys(cfg, ids)[1]
    if world > 1:  # a bank has one writer (flock): ranks never share a folder
        root = root / f"rank{rank}"
    dirs = {c.sample_id: root / c.sample_id for c in convs}
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=cfg.eval.manager_max_new_tokens, seed=cfg.seed)
    facts = {c.sample_id: oracle_facts(c, cfg.eval) for c in convs if c.oracle}
    todo = [c for c in convs if not c.oracle]
    bar = lambda desc: tqdm(desc=desc, total=0, unit="prompt", dynamic_ncols=True, disable=rank != 0)
    if todo:
        with bar("stage-2 banks: extract") as b:
            facts.update(extract_all(todo, dirs, swap.view(base),
                                     with_tokens(greedy, cfg.eval.extract_max_new_tokens), cfg.eval, cfg.extract, b))
    with bar("stage-2 banks: manager") as b:
        builds = run_manager(convs, dirs, facts, swap.view(manager), embedder, greedy, cfg.eval, cfg.manager,
                             {"fsync": cfg.bank.fsync}, [], b)
    banks = {sid: build.bank for sid, build in builds.items()}
    if rank == 0:
        print(f"stage-2 banks: {len(banks)} conversations by manager {manager}, "
              f"{sum(len(b) for b in banks.values())} memories, in {root}")
    return [dataclasses.replace(it, bank=banks[it.conversation]) if it.conversation in banks else it
            for it in answer_items]


def train(cfg: RunConfig) -> dict:
    from memr1.engine.evaluate import run_eval
    from memr1.engine.swap import WeightSwap
    from memr1.rl.data import load_conversations
    from memr1.rl.items import build_items

    # Under torchrun, join the process group before any engine exists, so vLLM joins it too.
    rank, world = dist_utils.init(cfg.learner.device)
    if problem := world_problem(cfg.stage.prompts_per_step, world):
        raise ConfigError(problem)
    say = print if rank == 0 else (lambda *a, **k: None)
    run_dir = cfg.resolved_run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        (run_dir / "config.toml").write_text(dump_toml(cfg))
    embedder = make_embedder(cfg)
    conversations = load_conversations(cfg.data.path or None, n=cfg.data.n, seed=cfg.data.seed, split="train")
    manager_items, answer_items = build_items(conversations, embedder, cfg.items)
    say(f"{len(conversations)} train conversations: {len(manager_items)} manager items, "
        f"{len(answer_items)} answer items" + (f", {world} data-parallel ranks" if world > 1 else ""))
    base = resolve_model(cfg.generator.model)
    # Two engines serve the whole run: the policy being trained, and a second one whose weights swap
    # between roles (stage 1's frozen answer agent, stage 2's bank-building manager, the evals).
    # Under torchrun each rank has its own pair, made in the same order (vLLM's creation is collective).
    policy = make_generator(cfg.generator)
    swap = WeightSwap(make_generator(cfg.generator), loaded=base)
    finals: dict[str, str] = {}
    for name in cfg.stages:
        t = time.perf_counter()
        if name == "manager":
            items = manager_items
        elif cfg.items.answer_banks == "manager":
            manager = finals.get("manager") or cfg.items.manager_checkpoint or base
            items = manager_banks(cfg, conversations, answer_items, embedder, swap, Path(manager), run_dir,
                                  rank, world)
        else:
            items = answer_items
        finals[name] = str(train_stage(cfg, name, items, embedder, run_dir, policy, swap.view(base)))
        say(f"stage {name}: {time.perf_counter() - t:.0f}s, final checkpoint {finals[name]}")
    evals = {}
    # base: the untrained pipeline; trained: this run's checkpoints. On rank 0 alone (see the module doc).
    for which in (cfg.eval_after if rank == 0 else []):
        ecfg = msgspec.structs.replace(cfg, eval=msgspec.structs.replace(
            cfg.eval, baseline="base" if which == "base" else "memr1"))
        evals[which] = str(run_eval(ecfg, cfg.eval_split, checkpoint=None if which == "base" else str(run_dir),
                                    generator=swap.generator, label="base" if which == "base" else ""))
    if len(evals) > 1:
        print(compare_evals(evals))
    dist_utils.finish()
    return {"run_dir": str(run_dir), "checkpoints": finals, "evals": evals, "rank": rank, "world": world}


def compare_evals(evals: dict[str, str]) -> str:
    """Overall EM / F1 / BLEU-1 / J (%) and the manager's oracle scores (%) of each eval, side by side."""
    rows = [f"{'policy':8} {'EM':>6} {'F1':>6} {'BLEU-1':>7} {'J':>6} {'op acc':>7} {'recall':>7} {'prec':>6}  report"]
    for which, path in evals.items():
        r = json.loads(Path(path).read_text())
        o, m = r.get("oracle") or {}, r["metrics"]["overall"]
        cell = lambda x, scale=1.0: "-" if x is None else f"{scale * x:.1f}"
        rows.append(f"{which:8} {cell(m['em']):>6} {cell(m['f1']):>6} {cell(m['bleu1']):>7} {cell(m['j']):>6} "
                    f"{cell(o.get('op_accuracy'), 100):>7} {cell(o.get('fact_recall'), 100):>7} "
                    f"{cell(o.get('fact_precision'), 100):>6}  {path}")
    return "\n".join(rows)


def train_cli(args) -> int:
    if args.resume:
        resolved = Path(args.resume) / "config.toml"
        if not resolved.is_file():
            raise SystemExit(f"--resume {args.resume}: no config.toml there; is it a run directory?")
        cfg = load_config(resolved, args.overrides)
    elif args.config:
        cfg = load_config(args.config, args.overrides)
    else:
        raise SystemExit("memr1 train needs --config FILE or --resume RUN_DIR")
    text, fits = plan_text(cfg)
    if args.dry_run:
        print(text)
        return 0 if fits else 2
    if not fits:
        print(text)
        raise SystemExit("the plan does not fit this machine (see above); nothing was started")
    out = train(cfg)
    if out["rank"] == 0:
        print(json.dumps(out, indent=2))
    return 0
