"""`memr1 train`: both Memory-R1 stages through the one loop, into a run directory.

runs/<name>/config.toml            the resolved config
runs/<name>/metrics.jsonl          one JSON object per step (both stages)
runs/<name>/tb/                    TensorBoard
runs/<name>/<stage>/checkpoints/step_<N>/   HF-loadable policy + optimizer, RNG and data state
Stage 2 (answer) runs after stage 1 (manager). Both stages' banks come from the frozen pipeline in
rl/items.py (oracle or raw); building stage 2's banks with the trained stage-1 manager is still to do.
"""
import json
import time
from pathlib import Path

import msgspec
from tqdm import tqdm

from memr1.engine.config import ConfigError, RunConfig, dump_toml, load_config, make_embedder
from memr1.engine.generation import make_generator, resolve_model
from memr1.engine.learner import Learner
from memr1.engine.loop import Loop
from memr1.engine.plan import plan_text
from memr1.engine.stages import AnswerStage, ManagerStage


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


def latest_checkpoint(stage_dir: Path) -> Path | None:
    steps = sorted((int(p.name.split("_")[1]), p) for p in (stage_dir / "checkpoints").glob("step_*")
                   if p.name.split("_")[1].isdigit())
    return steps[-1][1] if steps else None


def train_stage(cfg: RunConfig, name: str, items, embedder, run_dir: Path) -> Path:
    stage_dir = run_dir / name
    base = str(resolve_model(cfg.generator.model))
    learner = Learner(msgspec.structs.replace(cfg.learner, model_path=base, temperature=cfg.sampling.temperature))
    policy = make_generator(cfg.generator)
    start = 0
    ckpt = latest_checkpoint(stage_dir)
    if ckpt is not None:  # resume: same data order (items are picked by step), same weights
        state = learner.load_checkpoint(str(ckpt))
        start = int(state.get("data", {}).get("step", state.get("step", 0)))
        named = (p for bucket in learner.export_weights(cfg.loop.weight_bucket_mb << 20) for p in bucket)
        policy.update_weights(named, start)
        print(f"resuming {name} from {ckpt} at step {start}")
    if name == "manager":
        frozen = make_generator(cfg.generator)  # the frozen Answer Agent: base weights, its own engine
        stage = ManagerStage(items[0], frozen, embedder, cfg.stage, cfg.sampling, cfg.manager, cfg.answer)
    else:
        stage = AnswerStage(items[1], embedder, cfg.stage, cfg.sampling, cfg.answer)
    log = RunLog(run_dir, name, cfg.loop.steps, start)

    def save(step: int) -> None:
        learner.save_checkpoint(str(stage_dir), {"step": step})

    try:
        Loop(stage, policy, learner, cfg.loop, on_step=log, save_checkpoint=save).run(start)
    finally:
        log.close()
    return latest_checkpoint(stage_dir)


def train(cfg: RunConfig) -> dict:
    from memr1.rl.data import load_conversations
    from memr1.rl.items import build_items

    unknown = [s for s in cfg.stages if s not in ("manager", "answer")]
    if unknown:
        raise ConfigError(f"stages: unknown stage(s) {unknown}; use 'manager' and/or 'answer'")
    run_dir = cfg.resolved_run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(dump_toml(cfg))
    embedder = make_embedder(cfg)
    conversations = load_conversations(cfg.data.path or None, n=cfg.data.n, seed=cfg.data.seed, split="train")
    items = build_items(conversations, embedder, cfg.items)
    print(f"{len(conversations)} train conversations: {len(items[0])} manager items, {len(items[1])} answer items")
    finals = {}
    for name in cfg.stages:
        t = time.perf_counter()
        finals[name] = str(train_stage(cfg, name, items, embedder, run_dir))
        print(f"stage {name}: {time.perf_counter() - t:.0f}s, final checkpoint {finals[name]}")
    return {"run_dir": str(run_dir), "checkpoints": finals}


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
    print(json.dumps(out, indent=2))
    return 0
