"""Can the manager's reward see each kind of op? For manager items, the frozen Answer Agent scores the
bank after the oracle's reply against the bank after the most tempting wrong reply of each kind, each
applied to its own fork and scored by `ManagerStage.score`, the function rollouts use:

  ADD:skip        the new fact is not written
  ADD:overwrite   the new fact overwrites the first shown memory (UPDATE instead of ADD)
  UPDATE:as_add   a changed fact is written as a new memory; the stale one stays
  UPDATE:wrong_id a changed fact overwrites another shown memory: the stale one stays and the other is lost
  DELETE:skip     a memory that is no longer true stays
  NONE:add        a restatement is written as a second memory
  NONE:update     a restatement replaces the (often more detailed) memory it restates

Each item varies one op of each kind its oracle reply holds; the share of items where the two
replies give different EM is the share of that kind's decisions the reward can teach.

Can the policy make those decisions? `decision_positions` finds, in the oracle's reply, the tokens
where it decides: each op's event, and the id of each op on a shown memory (written after the copied
memory). A policy teacher-forced on the reply (bench.op_probe --decisions) puts a probability on each:
a low one on UPDATE means greedy replies never UPDATE and sampling rarely does, whatever the reward.
"""
import bisect
import json
import re

from memr1.rl.task.agents.manager import reply_item
from memr1.rl.task.data.synthetic import call_ops
from memr1.rl.task.stages.warm import manager_target

VARIANTS = ("ADD:skip", "ADD:overwrite", "UPDATE:as_add", "UPDATE:wrong_id", "DELETE:skip", "NONE:add",
            "NONE:update")

_EVENT = re.compile(r'"event": "(\w+)"')
_ID = re.compile(r'"event": "(\w+)", "old_memory": "(?:[^"\\]|\\.)*", "id": "')


def decision_positions(reply: str, tokenizer) -> list[tuple[str, str, int]]:
    """(decision, event, index into `rl.generation.reply_ids(tokenizer, reply)`) for a reply written by
    `reply_item`: ("event", E, the token where each op's event starts) and ("id", E, the token where the
    id of each op on a shown memory starts)."""
    offsets = tokenizer(reply, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    starts = [a for a, _ in offsets]
    at = lambda char: bisect.bisect_right(starts, char) - 1
    return ([("event", m.group(1), at(m.start(1))) for m in _EVENT.finditer(reply)]
            + [("id", m.group(1), at(m.end())) for m in _ID.finditer(reply)])


def decision_probs(model, tokenizer, prompts: list[list[dict]], replies: list[str]) -> dict[tuple[str, str], list[float]]:
    """(decision, event) -> the probability a causal LM (HF) puts on the reply's token at each such
    decision (`decision_positions`), teacher-forced on each (chat prompt, reply)."""
    import torch

    from memr1.rl.generation import chat_prompt_ids, reply_ids

    out: dict[tuple[str, str], list[float]] = {}
    for messages, reply in zip(prompts, replies):
        prompt, tokens = chat_prompt_ids(tokenizer, messages), reply_ids(tokenizer, reply)
        with torch.inference_mode():   # the head only over the reply's positions: the prompt is most of the tokens
            logits = model(torch.tensor([prompt + tokens]), logits_to_keep=len(tokens) + 1).logits[0, :-1].float()
        logprobs = torch.log_softmax(logits, -1)
        for decision, event, i in decision_positions(reply, tokenizer):
            out.setdefault((decision, event), []).append(float(logprobs[i, tokens[i]].exp()))
    return out


def _reply(ops: list[dict]) -> str:
    return json.dumps({"memory": ops}, ensure_ascii=False)


def wrong_replies(item, shown: list[str], oracle: dict, list_unchanged: bool, turn) -> tuple[str, dict[str, str]]:
    """(the oracle's reply, {variant: a reply with that one mistake}) for one item's prompt."""
    target = manager_target(turn, shown, item.call, oracle, list_unchanged)
    ops = [op for op in json.loads(target)["memory"] if op["event"] != "NONE"]
    n, out = len(shown), {}
    first = lambda event: next((i for i, op in enumerate(ops) if op["event"] == event), None)
    used = {op["id"] for op in ops if op["event"] != "ADD"}
    if (i := first("ADD")) is not None:
        out["ADD:skip"] = _reply(ops[:i] + ops[i + 1:])
        if n and "0" not in used:
            swap = reply_item("UPDATE", 0, ops[i]["text"], shown[0])
            out["ADD:overwrite"] = _reply(ops[:i] + [swap] + ops[i + 1:])
    if (i := first("UPDATE")) is not None:
        out["UPDATE:as_add"] = _reply(ops[:i] + ops[i + 1:] + [reply_item("ADD", text=ops[i]["text"])])
        if (other := next((str(j) for j in range(n) if str(j) not in used), None)) is not None:
            wrong = reply_item("UPDATE", int(other), ops[i]["text"], shown[int(other)])
            out["UPDATE:wrong_id"] = _reply(ops[:i] + [wrong] + ops[i + 1:])
    if (i := first("DELETE")) is not None:
        out["DELETE:skip"] = _reply(ops[:i] + ops[i + 1:])
    local = {text: str(i) for i, text in reversed(list(enumerate(shown)))}
    restated = [op for op in call_ops(oracle["timeline"], item.call["dia_ids"])
                if op["event"] == "NONE" and op["old_memory"] in local and local[op["old_memory"]] not in used]
    if restated:
        op = restated[0]
        out["NONE:add"] = _reply(ops + [reply_item("ADD", text=op["fact"])])
        out["NONE:update"] = _reply(ops + [reply_item("UPDATE", int(local[op["old_memory"]]), op["fact"],
                                                      op["old_memory"])])
    return target, out


def op_visibility(stage, items, oracles: dict) -> dict:
    """{variant: {"items", "differ", "share", "em_oracle", "em_wrong"}} over `items` (EM in points),
    scored by `stage` (a ManagerStage holding the frozen answerer, embedder and task settings)."""
    from memr1.rl.task.turns import manager_turns

    turns = manager_turns([(it.bank, it.call) for it in items],
                          stage.ctx.embedder, stage.ctx.task.manager)
    owners, replies, labels = [], [], []
    for i, (it, turn) in enumerate(zip(items, turns)):
        shown = [it.bank.get(b).text for b in turn.prompt.bank_ids]
        target, wrong = wrong_replies(it, shown, oracles[it.conversation], stage.ctx.task.manager.list_unchanged, turn)
        for label, text in [("oracle", target)] + list(wrong.items()):
            owners.append(i)
            replies.append(text)
            labels.append(label)
    scored = stage.score(items, turns, owners, replies)
    em = [100 * sum(s) / len(s) if s else 0.0 for s in scored.scores]
    oracle_em = {i: e for i, label, e in zip(owners, labels, em) if label == "oracle"}
    out = {}
    for variant in VARIANTS:
        rows = [(oracle_em[i], e) for i, label, e in zip(owners, labels, em) if label == variant]
        out[variant] = {"items": len(rows), "differ": sum(a != b for a, b in rows),
                        "share": sum(a != b for a, b in rows) / len(rows) if rows else None,
                        "em_oracle": sum(a for a, _ in rows) / len(rows) if rows else None,
                        "em_wrong": sum(b for _, b in rows) / len(rows) if rows else None}
    return out
