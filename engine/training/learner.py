"""The learner: one optimizer step of GRPO or PPO on a rank's groups (rl/records.py), on FSDP2.

Each rank trains on its own groups. Advantages are per group (GRPO) or per sequence (PPO), so they
need nothing from other ranks; what crosses ranks is scalars only: the step's response-token and
sequence counts (the loss denominators), the number of micro-batches, PPO's whitening moments, and the
metric sums. Every micro-batch's loss is its share of the global mean, so the step does not depend on
how groups fall onto ranks or micro-batches.

A supervised target (the warm start's scripted replies: advantage 1) has a ratio of 1, so the
surrogate's gradient is then the reply's negative log-likelihood.

The algorithm (advantages for every stage kind, PPO's targets, the losses) lives in rl/algos/; the
learner runs the models, plans the micro-batches (`plan`) and owns its state (`state_dict`).
"""
from __future__ import annotations

import contextlib
import math
import random
import time
import uuid
from typing import Iterator

import numpy as np
import torch

from memr1.engine.observe.throughput import bf16_peak, native_bf16
from memr1.engine.training import dist as dist_utils, lora, prefix_attention, state as learner_state
from memr1.engine.training.batching import Plan, build_micro, micro_count, split_units, units_of
from memr1.engine.training.config import LearnerConfig
from memr1.engine.training.policy import PolicyModel, adamw, freeze_below, load_lm, warmup_schedule
from memr1.rl.algos.advantages import advantages
from memr1.rl.algos.grpo import drop_zero_advantage_groups, token_advantages
from memr1.rl.algos.ppo import Critic, ppo_token_targets
from memr1.rl.algos.losses import Denom, kl_penalty, policy_loss, value_loss
from memr1.rl.records import TrainBatch
from memr1.rl.spans import span


def seed_everything(seed: int) -> None:
    """torch, python and numpy streams from the run seed (a checkpoint saves and restores all three)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


class Learner:
    def __init__(self, cfg: LearnerConfig, model_path: str, *, lr: float, temperature: float = 1.0, seed: int = 0):
        """`model_path`: the weights to start from; `temperature`: the generator's sampling temperature
        (log-probs are of the distribution sampled from); `seed`: the run seed."""
        if cfg.loss.kl_in_reward and cfg.algo != "ppo" and cfg.loss.kl_coef:
            raise ValueError("loss.kl_in_reward is supported with algo='ppo'; for GRPO put the KL in the loss")
        self.cfg, self.lr = cfg, lr
        self.d = dist_utils.setup(cfg.device)
        self.cpu_bf16 = cfg.cpu_precision == "bf16" or (cfg.cpu_precision == "fast" and native_bf16("cpu"))
        attn = dist_utils.attn_implementation(cfg.attn_impl)
        # Packing needs a variable-length kernel; with mask-based attention it would cost O(packed^2).
        self.packed = cfg.layout == "packed" or (cfg.layout == "auto" and attn == "flash_attention_2")
        if not self.packed:  # the rows layout has one attention: memr1's prefix attention, over SDPA
            if cfg.attn_impl not in ("auto", "sdpa"):
                raise ValueError(f"learner.attn_impl={cfg.attn_impl!r} needs learner.layout='packed'; the rows "
                                 "layout runs memr1's prefix attention over SDPA (attn_impl 'auto' or 'sdpa')")
            attn = prefix_attention.NAME
        seed_everything(seed)
        ac, dev = cfg.activation_checkpointing, self.d.device
        lm = load_lm(model_path, attn, ac, dev)
        self.lora_scale = None   # LoRA (training/lora.py): only the adapters train
        # Names this learner's base weights, which never change under LoRA: a generator holding adapters
        # over them takes adapter-only pushes (generation.weights.push_weights); None without LoRA.
        self.base_token = None
        if cfg.lora.rank:
            if cfg.train_layers:
                raise ValueError("learner.lora trains the adapters only; set learner.train_layers = 0 with it")
            lm = lora.add_adapters(lm, cfg.lora)
            self.lora_scale = lora.scaling(cfg.lora)
            self.base_token = uuid.uuid4().hex
        elif cfg.train_layers:
            freeze_below(lm, cfg.train_layers)
        self.trainable_params = sum(p.numel() for p in lm.parameters() if p.requires_grad)
        self.total_params = sum(p.numel() for p in lm.parameters())
        self.hf_config = lm.config
        # For MFU (observe/throughput.py): the parameters in GEMMs (all but the input embedding, whose
        # lookup is no GEMM; a tied lm_head counts), taken before sharding; the GPUs' bf16 peak.
        head, emb = lm.get_output_embeddings(), lm.get_input_embeddings()
        tied = head is not None and head.weight is emb.weight
        self.flops_params = sum(p.numel() for p in lm.parameters()) - (0 if tied else emb.weight.numel())
        peak = bf16_peak(torch.cuda.get_device_name(dev)) if dev.type == "cuda" else None
        self.peak_flops = peak * self.d.world if peak else None
        self.policy = dist_utils.shard(PolicyModel(lm, temperature, cfg.logprob_chunk), dist_utils.decoder_layers(lm), self.d)
        self.optim = adamw([p for p in self.policy.parameters() if p.requires_grad], lr, cfg.betas, cfg.weight_decay)
        self.sched = warmup_schedule(self.optim, cfg.warmup_steps)
        self.ref = None
        if cfg.loss.kl_coef:  # coefficient 0: the reference model is never loaded
            ref_lm = load_lm(model_path, attn, ac, dev).requires_grad_(False)
            self.ref = dist_utils.shard(PolicyModel(ref_lm, temperature, cfg.logprob_chunk),
                                        dist_utils.decoder_layers(ref_lm), self.d)
        self.critic = None
        if cfg.algo == "ppo":
            backbone = load_lm(model_path, attn, ac, dev, head=False)
            self.critic = dist_utils.shard(Critic(backbone, self.hf_config.hidden_size).to(dev), backbone.layers, self.d)
            self.critic_optim = adamw(self.critic.parameters(), cfg.ppo.critic_lr, cfg.betas, cfg.weight_decay)
            self.critic_sched = warmup_schedule(self.critic_optim, cfg.warmup_steps)
        # Parameter names and full shapes, fixed from here on (a DTensor's shape is global): a push reads
        # them without walking the module tree, which costs milliseconds on an adapted model.
        self.param_shapes = {n: tuple(p.shape) for n, p in self.policy.lm.named_parameters()}
        self.step = 0
        self.version = 0

    @property
    def device(self) -> torch.device:
        return self.d.device

    @property
    def rank(self) -> int:
        return self.d.rank

    @property
    def world(self) -> int:
        return self.d.world

    def barrier(self) -> None:
        """Wait for every rank (a no-op in a world of one)."""
        self.d.barrier()

    def compute(self):
        """bf16 compute with fp32 master weights on a GPU: FSDP2's mixed-precision policy does it when
        sharded; a single unsharded GPU gets the same numerics from autocast. On CPU, fp32 or bf16
        autocast (`cpu_precision`, resolved once at construction)."""
        if self.d.device.type == "cuda" and self.d.mesh is None:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        if self.d.device.type == "cpu" and self.cpu_bf16:
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # -- one optimizer step ------------------------------------------------------------------------
    def plan(self, batch: TrainBatch) -> Plan:
        """This rank's micro-batches for `batch`, as `train_step` builds them. GRPO leaves out the groups
        whose advantages are all zero when that changes nothing (no KL or entropy term). The count is
        agreed over ranks (a collective: every rank calls it)."""
        cfg, d = self.cfg, self.d
        seq_adv = advantages(batch, cfg.grpo) if self.critic is None else None
        work = signal = batch
        if seq_adv is not None:
            signal, signal_adv = drop_zero_advantage_groups(batch, seq_adv)
            if cfg.skip_zero_advantage and not (cfg.loss.kl_coef or cfg.loss.entropy_coef):
                work, seq_adv = signal, signal_adv
        units = units_of(work, cfg.share_prefix and not self.packed)
        k = int(d.all_reduce_max(torch.tensor([micro_count(units, cfg.micro_batch_tokens)], device=d.device)).item())
        micros = [build_micro(part, self.packed, cfg.pad_bucket, d.device) for part in split_units(units, k)]
        return Plan(work, signal, seq_adv, units, micros)

    def train_step(self, batch: TrainBatch) -> dict:
        t0 = time.perf_counter()
        cfg, d = self.cfg, self.d
        self._check(batch)
        p = self.plan(batch)
        work, micros = p.work, p.micros
        # Only scalars cross ranks: the loss denominators, what was computed, and (in `plan`) the
        # micro-batch count (collectives must line up).
        tokens, seqs, computed, positions, signal_tokens = d.all_reduce_sum(torch.tensor(
            [float(batch.response_tokens), float(batch.num_seqs), float(work.response_tokens), float(work.positions),
             float(p.signal.response_tokens)], device=d.device)).tolist()
        if seqs == 0:
            raise ValueError("TrainBatch is empty: no rank holds a sequence")
        denom = Denom(tokens=tokens, seqs=seqs, horizon=cfg.loss.horizon)
        if self.critic is not None:
            self._ppo_targets(work, micros)
        else:
            for m in micros:
                m.advantages = torch.zeros(1, device=d.device) if m.dummy else token_advantages(p.seq_adv, m.gseq, m.seq_ids)

        sums: dict[str, torch.Tensor] = {}
        for i, micro in enumerate(micros):
            self._set_sync(i == len(micros) - 1)
            want_entropy = bool(cfg.loss.entropy_coef)
            with span("learner_forward"), self.compute():
                out = self.policy(micro, entropy=want_entropy)
            logp, ent = out if want_entropy else (out, None)
            behav = micro.behav_logp
            old = logp.detach() if (cfg.anchor != "behaviour" or behav is None) else \
                torch.where(behav.isnan(), logp.detach(), behav)   # NaN: a hint's token (rl/task/hints.py)
            ref_logp = None
            if self.ref is not None and not cfg.loss.kl_in_reward:
                with span("learner_forward"), torch.no_grad(), self.compute():
                    ref_logp = self.ref(micro)
            loss, m = policy_loss(logp, old, micro.advantages, micro.seq_ids, micro.num_seqs, denom, cfg.loss,
                                  behav_logp=behav if cfg.anchor == "current" else None, ref_logp=ref_logp,
                                  entropy=ent)
            # FSDP averages gradients over ranks, but each loss is already a share of the global mean:
            # scale by world so the reduction is a sum. (set_gradient_divide_factor needs PREMUL_SUM,
            # which gloo lacks.) A dummy micro-batch only keeps the collectives in step: weight 0.
            scale = 0.0 if micro.dummy else float(d.world)
            with span("learner_backward"):
                (loss * scale).backward()
            m["loss"] = loss.detach()
            if self.critic is not None:
                with span("learner_forward"), self.compute():
                    values = self.critic(**micro.model_inputs())
                values = values.reshape(-1)[micro.index]
                vloss = value_loss(values, micro.old_values, micro.returns, micro.seq_ids, micro.num_seqs,
                                   denom, cfg.loss)
                with span("learner_backward"):
                    (vloss * scale).backward()
                m["value_loss"] = vloss.detach()
            for key, v in m.items():
                sums[key] = sums.get(key, 0.0) + (0.0 if micro.dummy else v.float())

        lr = self.sched.get_last_lr()[0]  # the rate this step used
        actor_frozen = cfg.algo == "ppo" and self.step < cfg.ppo.critic_warmup
        with span("optimizer"):
            metrics = {"grad_norm": self._clip_and_step(self.policy, self.optim, self.sched, not actor_frozen)}
            if self.critic is not None:
                metrics["critic_grad_norm"] = self._clip_and_step(self.critic, self.critic_optim, self.critic_sched)
        names = sorted(sums)
        totals = d.all_reduce_sum(torch.stack([torch.as_tensor(sums[key]).float().cpu() for key in names]).to(d.device))
        for key, v in zip(names, totals.tolist()):   # per computed token
            metrics[key] = v if key in ("loss", "value_loss") else v / max(computed, 1.0)
        self.step += 1
        self.version += 1
        dt = time.perf_counter() - t0
        metrics.update(weight_version=self.version, lr=lr, positions=int(positions), train_s=dt,
                       positions_per_s=positions / dt, computed_frac=computed / max(tokens, 1.0),
                       signal_frac=signal_tokens / max(tokens, 1.0),
                       staleness=self.version - 1 - batch.weight_version,
                       model_flops=6.0 * self.flops_params * positions)
        if self.peak_flops:
            metrics["peak_flops"] = self.peak_flops
        return metrics

    @torch.no_grad()
    def _ppo_targets(self, work: TrainBatch, micros: list) -> None:
        """The critic's values (and, with the KL in the reward, the KL penalties) per micro-batch, turned
        into advantages and returns by rl/algos/ppo.py."""
        cfg = self.cfg
        kl_coef = cfg.loss.kl_coef if cfg.loss.kl_in_reward else 0.0
        for m in micros:
            with self.compute():
                m.old_values = self.critic(**m.model_inputs()).reshape(-1)[m.index].float()
                if kl_coef:
                    m.kl = kl_penalty(self.policy(m), self.ref(m), cfg.loss.kl_estimator)
        rewards = torch.tensor([r for g in work.groups for r in g.rewards], dtype=torch.float32)
        targets = ppo_token_targets(rewards, micros, [m.old_values for m in micros], cfg.ppo, self.d.all_reduce_sum,
                                    [m.kl for m in micros] if kl_coef else None, kl_coef)
        for m, (adv, ret) in zip(micros, targets):
            m.advantages, m.returns = adv, ret

    def _check(self, batch: TrainBatch) -> None:
        vocab = self.hf_config.vocab_size
        for g in batch.groups:
            ids = [t for seq in [g.prompt_ids, *g.responses] for t in seq]
            if ids and (max(ids) >= vocab or min(ids) < 0):
                raise ValueError(f"group {g.source!r}: token ids must lie in [0, {vocab}); got {min(ids)}..{max(ids)}")

    def _set_sync(self, sync: bool):
        # Gradient accumulation: reduce-scatter only after the last micro-batch.
        for model in (self.policy, self.critic):
            if model is not None and hasattr(model, "set_requires_gradient_sync"):
                model.set_requires_gradient_sync(sync)

    def _clip_and_step(self, model, optim, sched, update: bool = True) -> float:
        norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], self.cfg.grad_clip)
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if update and math.isfinite(norm):  # a non-finite gradient skips the update, never poisons weights
            optim.step()
        optim.zero_grad(set_to_none=True)
        sched.step()
        return norm

    # -- state -------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything a resume needs, as full tensors (state.py lists the entries). A
        collective: every rank calls it; with a process group only rank 0's holds the tensors. On an
        unsharded CPU model they are the live tensors, which the next step changes."""
        critic = (self.critic, self.critic_optim, self.critic_sched) if self.critic is not None else ()
        sd = {"config": self.hf_config, **learner_state.gather(self.policy, self.optim, self.sched, *critic),
              "step": self.step, "version": self.version}
        if self.lora_scale is not None:   # the merged model by HF names, and the adapter in peft's layout
            sd["model"], sd["adapter"] = lora.split_state(sd["model"], self.lora_scale)
        return sd

    def load_state_dict(self, sd: dict) -> None:
        """Restore `state_dict`'s output (the full state, on every rank). The model and the critic's
        presence are checked before anything changes. The configured lr wins over the saved one."""
        learner_state.check_compatible(sd["config"], self.hf_config)
        if self.lora_scale is None:
            weights = learner_state.checked_weights(sd["model"], self.policy.lm)
        elif "adapter" not in sd:
            raise ValueError("the state holds no adapter: it was not written by a run with learner.lora")
        else:   # the base weights are the start model's, which LoRA never changes
            weights = learner_state.checked_subset(lora.adapter_params(sd["adapter"]), self.policy.lm)
        if self.critic is not None and "critic" not in sd:
            raise ValueError("the state holds no critic: it was not written by a PPO run")
        learner_state.load_model(self.policy, self.optim, self.sched, weights, sd["optimizer"], sd["scheduler"],
                                 strict=self.lora_scale is None)
        learner_state.use_lr(self.optim, self.sched, self.lr)
        if self.critic is not None:
            learner_state.load_critic(self.critic, self.critic_optim, self.critic_sched, sd["critic"])
        self.step, self.version = int(sd["step"]), int(sd["version"])

    def adapter_config(self, base_model: str = ""):
        """The adapter's peft config (checkpoints/io.py writes it beside the adapter)."""
        return lora.peft_config(self.cfg.lora, base_model)

    def continue_at(self, step: int) -> None:
        """Count on from `step` (step and weight version both): a phase that starts from an earlier
        checkpoint keeps the loop's step numbers. The learner alone writes its counters."""
        self.step = self.version = step

    # -- weights out ---------------------------------------------------------------------------------
    def weight_manifest(self, part: str = "merged") -> dict[str, tuple[int, ...]]:
        """Name -> full shape of exactly what `export_weights(part)` yields, with no collective (a
        DTensor's shape is global). Pass it as update_weights(manifest=) so the generator streams the export."""
        return {out: self.param_shapes[name] for out, name in self._exported(part)}

    def _exported(self, part: str) -> list[tuple[str, str]]:
        """(name out, parameter name) of a part: `merged` (every weight by HF name; under LoRA each
        adapted one merged with its A and B), or under LoRA `base` (the frozen weights by HF name,
        unmerged) or `adapter` (A and B under the adapted model's names, which a generator holding the
        same adapters has too)."""
        names = list(self.param_shapes)   # named_parameters' order, tied duplicates skipped
        if self.lora_scale is None and part == "merged":
            return [(n, n) for n in names]
        if self.lora_scale is None or part not in lora.PARTS:
            raise ValueError(f"export part {part!r}: {'merged' if self.lora_scale is None else lora.PARTS} only")
        if part == "adapter":
            return [(n, n) for n in names if lora.is_adapter(n)]
        return [(lora.hf_name(n), n) for n in names if not lora.is_adapter(n)]

    def export_weights(self, part: str = "merged") -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (name, full tensor) pairs of a part (see _exported) for a generator's `update_weights`
        (see generation.weights.push_weights). One parameter is gathered at a time and dropped before the
        next is, so no second full copy of the model ever exists here; the generator buckets them on its
        side. Every rank must iterate (gathering is a collective)."""
        lm = self.policy.lm

        def full(name):
            with span("weight_export"):
                return dist_utils.full_tensor(lm.get_parameter(name).detach())
        if self.lora_scale is not None and part == "merged":   # each adapted weight merged with its A and B
            named = lora.merged_items(self.param_shapes, full, self.lora_scale)
        else:
            named = ((out, full(name)) for out, name in self._exported(part))
        for name, t in named:
            yield name, t
            del t
