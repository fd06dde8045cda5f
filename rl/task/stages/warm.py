"""Warm start: a few supervised steps on the synthetic oracle before RL, as a stage of its own through
the same loop, learner and checkpoints. The same stage is each RL stage's supervised control
("<role>_control"): the warm checkpoint trained further on the RL stage's own prompts, in its order.

A warm group is one prompt, built by the same turn code as the RL stage, with one scripted reply, a
supervised target (advantage 1, rl/algos/advantages.py). With no sampling there is nothing to correct
for, and the policy-gradient loss on a ratio of 1 has the gradient of the reply's negative
log-likelihood: supervised fine-tuning.
- answer agent: the evidence memories, copied as the prompt shows them, then `Answer: <gold>`
  (memory distillation), or just the answer line when `answer.distill` is off;
- manager: the oracle's ops for the call, in the op JSON the prompt asks for (one item per fact, in
  order; `manager_target`).
The oracle decides only what is imitated here; RL stages are rewarded by outcomes alone.
"""
import json
import time

from memr1.rl.task.agents.answer import AnswerConfig, memory_lines
from memr1.rl.task.agents.manager import reply_item
from memr1.rl.task.data.synthetic import call_ops
from memr1.rl.generation import chat_prompt_ids, reply_ids
from memr1.rl.task.train_items import step_items
from memr1.rl.records import TARGET, Group, Rollout, TrainBatch
from memr1.rl.task.stages.calls import StageConfig
from memr1.rl.task.stages.context import StageContext
from memr1.rl.task.turns import AnswerRequest, ManagerTurn, answer_prompts, manager_turns


def answer_target(request: AnswerRequest, qa, oracle: dict, cfg: AnswerConfig) -> str:
    """What a perfect answer agent writes for `request` (its prompt built by answer_prompts)."""
    slots = {e["slot"] for e in oracle["timeline"] if e["dia_id"] in qa.evidence}
    evidence = {oracle["final_facts"][s] for s in slots if s in oracle["final_facts"]}
    if not cfg.distill:
        return f"Answer: {qa.answer}"
    picked = [m for ms in request.memories.values() for m in ms if m[1] in evidence]
    lines = memory_lines(picked, cfg) or ["- (none)"]
    return "Relevant memories:\n" + "\n".join(lines) + f"\nAnswer: {qa.answer}"


def manager_target(turn: ManagerTurn, shown_texts: list[str], call: dict, oracle: dict,
                   list_unchanged: bool = True) -> str:
    """The oracle's net ops for one call (`call_ops`), in the order of the call's facts, against the
    memories its prompt shows (local ids 0..k-1), each as `reply_item` writes it; with `list_unchanged`,
    then every shown memory no op concerns, as NONE. No reply can name a memory the prompt does not
    show, so an UPDATE of one is written as the ADD of its new text (what a perfect manager that sees
    only the prompt does), and a DELETE or NONE of one is left out."""
    local = {text: i for i, text in reversed(list(enumerate(shown_texts)))}
    out, touched = [], set()
    for op in call_ops(oracle["timeline"], call["dia_ids"]):
        i = local.get(op.get("old_memory"))
        if op["event"] == "ADD" or (op["event"] == "UPDATE" and i is None):
            out.append(reply_item("ADD", text=op["text"]))
        elif i is not None and i not in touched:
            touched.add(i)
            out.append(reply_item(op["event"], i, op["text"] if op["event"] == "UPDATE" else op["fact"],
                                  shown_texts[i]))
    if list_unchanged:
        out += [reply_item("NONE", i, old_memory=t) for i, t in enumerate(shown_texts) if i not in touched]
    return json.dumps({"memory": out}, ensure_ascii=False)


class WarmStage:
    """Supervised warm start of one role ("manager" or "answer") on the oracle; see the module doc."""

    def __init__(self, role: str, items, conversations: dict, ctx: StageContext, tokenizer, cfg: StageConfig,
                 name: str = ""):
        if role not in ("manager", "answer"):
            raise ValueError(f"WarmStage role must be manager or answer, got {role!r}")
        missing = sorted({it.conversation for it in items if not conversations[it.conversation].oracle})
        if missing:
            raise ValueError(f"a {role} warm start needs the synthetic oracle; {missing[:3]} have none")
        self.name, self.role = name or f"{role}_warm", role
        self.items, self.convs, self.ctx, self.tokenizer, self.cfg = items, conversations, ctx, tokenizer, cfg

    def rollout(self, step: int, generator) -> Rollout:
        t0 = time.perf_counter()
        items = step_items(self.items, step, self.cfg.prompts_per_step, self.ctx.rank, self.ctx.world)
        if self.role == "answer":
            requests = [AnswerRequest(it.bank, it.question.question, it.speakers) for it in items]
            prompts = answer_prompts(requests, self.ctx.embedder, self.ctx.task.answer)
            targets = [answer_target(r, it.question, self.convs[it.conversation].oracle, self.ctx.task.answer)
                       for r, it in zip(requests, items)]
        else:
            turns = manager_turns([(it.bank, it.call)
                                   for it in items], self.ctx.embedder, self.ctx.task.manager)
            prompts = [t.prompt.messages for t in turns]
            targets = [manager_target(t, [it.bank.get(i).text for i in t.prompt.bank_ids], it.call,
                                      self.convs[it.conversation].oracle, self.ctx.task.manager.list_unchanged)
                       for t, it in zip(turns, items)]
        groups = [Group(prompt_ids=chat_prompt_ids(self.tokenizer, p), responses=[reply_ids(self.tokenizer, t)],
                        behav_logprobs=None, rewards=[0.0], credit=[TARGET], source=it.source)
                  for p, t, it in zip(prompts, targets, items)]
        metrics = {"gen_s": 0.0, "score_s": time.perf_counter() - t0,
                   "response_tokens": sum(g.response_tokens for g in groups), "completions": len(groups)}
        return Rollout(TrainBatch(groups, generator.weight_version), metrics)
