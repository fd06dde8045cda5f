"""Hinted manager rollouts: a few completions of a group start from the oracle's reply.

Why: a warm manager that rarely writes an UPDATE (about one completion in twenty where the oracle
updates) never shows the outcome reward what a right UPDATE is worth, so RL drives UPDATE further down
(README, seed 1). Exploring that one decision is what hints buy. On a call whose oracle reply holds an
UPDATE or DELETE, `n` of the group's G completions are the oracle's reply up to that op's event,
through the opening quote of its "old_memory"; the policy writes the rest itself: which memory the op
concerns (so its id), and every later item. The reward scores the finished reply like any other, and
the group's advantages compare it with the policy's own samples, so the event is pushed up where the
policy then picks the right memory often enough to beat what it does unhinted, and down where not.

The prefix's tokens are trained as if sampled (importance weight 1: their behaviour log-prob is NaN,
which `rl.algos.losses.policy_loss` reads as "no correction"). That biases the gradient towards the oracle's
events, the point of a hint; a weight of the policy's own probability (about 0.05 on such an UPDATE)
would give back the on-policy gradient that does not find them. The idea follows prefix-guided RL
(e.g. Prefix-RFT); the oracle here is the synthetic data's ground truth, so hints need its timeline.
"""
import math
import re

from memr1.rl.generation import Completion, chat_prompt_ids
from memr1.rl.task.stages.warm import manager_target

HINT_EVENTS = ("UPDATE", "DELETE")   # the ops a warm manager rarely samples (ADD and NONE it writes)
_OP = re.compile(r'"event": "(%s)", "old_memory": "' % "|".join(HINT_EVENTS))


def hint_prefix(reply: str) -> str | None:
    """The oracle reply up to its first UPDATE or DELETE, through the quote that opens the memory it
    concerns; None when the reply holds neither."""
    m = _OP.search(reply)
    return reply[:m.end()] if m else None


def hinted_completion(c: Completion, prefix_ids: list[int], prefix: str) -> Completion:
    """A continuation sampled after `prompt + prefix`, as one completion of the prompt alone."""
    n = len(prefix_ids)
    return Completion(c.prompt_index, list(prefix_ids) + list(c.token_ids), [math.nan] * n + list(c.logprobs),
                      prefix + c.text, c.finish_reason, c.weight_version, list(c.prompt_token_ids[:-n]))


class Hints:
    """`n` hinted completions per group, for items whose oracle reply has a hint; `conversations`
    maps conversation ids to the synthetic conversations (their oracle timelines)."""

    def __init__(self, n: int, conversations: dict, list_unchanged: bool):
        self.n, self.convs, self.list_unchanged = n, conversations, list_unchanged

    def prefixes(self, items, turns) -> list[str | None]:
        out = []
        for it, turn in zip(items, turns):
            oracle = self.convs[it.conversation].oracle
            shown = [it.bank.get(i).text for i in turn.prompt.bank_ids]
            out.append(hint_prefix(manager_target(turn, shown, it.call, oracle, self.list_unchanged))
                       if oracle else None)
        return out

    def generate(self, generator, items, turns, group_size: int, sampling) -> tuple[list[list[Completion]], list[bool]]:
        """(group_size completions per turn, whether each turn's group is hinted): the last `n` of each
        group whose item has a hint continue its prefix; every other completion is sampled from the
        prompt alone. Two generate calls with one `n` each: G - n from every prompt, then n from every
        prompt (prefixed where hinted), so no completion is sampled and thrown away."""
        prefixes = self.prefixes(items, turns)
        messages = [t.prompt.messages for t in turns]
        first = generator.generate(messages, group_size - self.n, sampling)
        tok = generator.tokenizer
        ids = [tok.encode(p, add_special_tokens=False) if p else None for p in prefixes]
        second_prompts = [chat_prompt_ids(tok, m) + i if i else m for m, i in zip(messages, ids)]
        second = generator.generate(second_prompts, self.n, sampling)
        groups = []
        for a, b, i, p in zip(first, second, ids, prefixes):
            groups.append(list(a) + ([hinted_completion(c, i, p) for c in b] if i else list(b)))
        return groups, [i is not None for i in ids]

    def metrics(self, groups, hinted: list[bool]) -> dict:
        """hinted_share: the completions that continue a hint; hint_reward_gap: their mean reward minus
        that of the unhinted completions of the same groups (> 0: the hinted op pays under this policy)."""
        ours = [r for g, h in zip(groups, hinted) if h for r in g.rewards[-self.n:]]
        rest = [r for g, h in zip(groups, hinted) if h for r in g.rewards[:-self.n]]
        total = sum(len(g.rewards) for g in groups)
        gap = sum(ours) / len(ours) - sum(rest) / len(rest) if ours and rest else 0.0
        return {"hinted_share": len(ours) / total if total else 0.0, "hint_reward_gap": gap}
