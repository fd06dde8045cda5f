"""rl/task/hints.py: a hinted completion is the oracle's reply up to its first UPDATE or DELETE, then the
policy's own tokens; the stage trains the prefix with importance weight 1 and logs what hints earn."""
import json
import math

import pytest
import torch

from memr1.engine.config.errors import ConfigError
from memr1.engine.config.run import load_config
from memr1.memory_store import HashEmbedder
from memr1.rl.task.agents.answer import AnswerConfig
from memr1.rl.task.agents.manager import ManagerConfig, reply_item
from memr1.rl.algos.config import LossConfig
from memr1.rl.task.data import load_conversations
from memr1.rl.task.facts import oracle_facts
from memr1.rl.generation import Completion, chat_prompt_ids
from memr1.rl.task.hints import Hints, hint_prefix
from memr1.rl.task.train_items import ItemsConfig, manager_calls, manager_items, oracle_bank
from memr1.rl.algos.losses import Denom, policy_loss
from memr1.rl.task.stages.calls import ManagerRLConfig, ManagerStage
from memr1.rl.task.turns import Task, manager_turns
from memr1.rl.task.stages.warm import manager_target
from memr1.rl.task.stages.context import StageContext
from scripted import ScriptedGenerator

TASK = Task(manager=ManagerConfig(top_k=5, turns_per_call=2, max_new_tokens=64, list_unchanged=False),
            answer=AnswerConfig(max_new_tokens=4, distill=False))


def test_the_prefix_ends_where_the_policy_picks_the_memory():
    reply = json.dumps({"memory": [reply_item("ADD", text="Ann likes tea"),
                                   reply_item("UPDATE", 1, "Ann has 2 dogs", "Ann has 1 dog"),
                                   reply_item("DELETE", 0, "Ann quit", "Ann is a nurse")]})
    prefix = hint_prefix(reply)
    assert reply.startswith(prefix) and prefix.endswith('"event": "UPDATE", "old_memory": "')
    assert reply[len(prefix):].startswith('Ann has 1 dog", "id": "1"')
    assert hint_prefix(json.dumps({"memory": [reply_item("ADD", text="Ann likes tea")]})) is None


class Policy:
    """Continues each prompt with the oracle's rest of the reply (so a hinted completion is the oracle's
    reply), sampling plain prompts as 'no json'; every token's log-prob is -0.5."""

    def __init__(self, tokenizer, rests: dict):
        self.tokenizer, self.rests, self.calls, self.weight_version = tokenizer, rests, [], 0

    def generate(self, prompts, n, sampling):
        self.calls.append((list(prompts), n))
        out = []
        for i, p in enumerate(prompts):
            ids = chat_prompt_ids(self.tokenizer, p) if isinstance(p[0], dict) else list(p)
            text = self.rests.get(tuple(ids), "no json")
            tokens = self.tokenizer.encode(text, add_special_tokens=False)
            out.append([Completion(i, tokens, [-0.5] * len(tokens), text, "stop", 0, ids) for _ in range(n)])
        return out


def test_hinted_completions_continue_the_oracle_prefix_and_are_marked_for_the_loss(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    embedder = HashEmbedder(64)
    convs = load_conversations(None, n=6, split="train")
    specs = manager_calls(convs, {c.sample_id: oracle_facts(c) for c in convs}, 2)
    items = manager_items(specs, [oracle_bank(s, s.conv, embedder) for s in specs], ItemsConfig(guard_questions=0), 0)
    turns = manager_turns([(it.bank, it.call) for it in items], embedder, TASK.manager)
    by_id = {c.sample_id: c for c in convs}
    targets = [manager_target(t, [it.bank.get(i).text for i in t.prompt.bank_ids], it.call,
                              by_id[it.conversation].oracle, False) for it, t in zip(items, turns)]
    hinted = [i for i, r in enumerate(targets) if hint_prefix(r)][:3]
    plain = [i for i, r in enumerate(targets) if not hint_prefix(r)][:3]
    assert len(hinted) == len(plain) == 3
    picked = [items[i] for i in hinted + plain]
    rests = {}
    for i in hinted:
        prefix = hint_prefix(targets[i])
        ids = chat_prompt_ids(tokenizer, turns[i].prompt.messages) + tokenizer.encode(prefix, add_special_tokens=False)
        rests[tuple(ids)] = targets[i][len(prefix):]
    policy, G, n = Policy(tokenizer, rests), 5, 2
    stage = ManagerStage(picked, ScriptedGenerator(["Answer: none"]), StageContext(embedder, TASK),
                         ManagerRLConfig(prompts_per_step=6, group_size=G, hints=n), hints=Hints(n, by_id, False))
    rollout = stage.rollout(0, policy)

    assert [k for _, k in policy.calls] == [G - n, n]   # nothing sampled and thrown away
    groups = rollout.batch.groups
    for g, i in zip(groups, hinted + plain):
        assert len(g.responses) == G and g.prompt_ids == chat_prompt_ids(tokenizer, turns[i].prompt.messages)
        for j, (resp, lp) in enumerate(zip(g.responses, g.behav_logprobs)):
            text = tokenizer.decode(resp)
            if i in hinted and j >= G - n:
                k = len(tokenizer.encode(hint_prefix(targets[i]), add_special_tokens=False))
                assert text == targets[i] and all(math.isnan(x) for x in lp[:k]) and lp[k:] == [-0.5] * (len(lp) - k)
            else:
                assert text == "no json" and not any(math.isnan(x) for x in lp)
    # the oracle's reply beats an unparsed one (format penalty) in every hinted group
    assert rollout.metrics["hinted_share"] == pytest.approx(3 * n / (6 * G))
    assert rollout.metrics["hint_reward_gap"] > 0


def test_a_hints_token_trains_with_importance_weight_one():
    torch.manual_seed(0)
    logp = torch.randn(6, requires_grad=True)
    old, adv, seq = logp.detach(), torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, -1.0]), torch.tensor([0, 0, 0, 1, 1, 1])
    sampled = old - torch.tensor([0.1, -2.0, 0.3, 0.2, -3.0, 0.0])   # the sampler's log-probs
    hinted = sampled.clone()
    hinted[[1, 4]] = math.nan
    as_if_sampled_by_old = sampled.clone()
    as_if_sampled_by_old[[1, 4]] = old[[1, 4]]
    cfg, denom = LossConfig(), Denom(tokens=6.0, seqs=2.0)
    a, _ = policy_loss(logp, old, adv, seq, 2, denom, cfg, behav_logp=hinted)
    b, _ = policy_loss(logp, old, adv, seq, 2, denom, cfg, behav_logp=as_if_sampled_by_old)
    c, _ = policy_loss(logp, old, adv, seq, 2, denom, cfg, behav_logp=sampled)
    assert torch.isfinite(a) and a.item() == pytest.approx(b.item()) and a.item() != pytest.approx(c.item())


def test_hints_need_an_unhinted_completion_in_each_group(tmp_path):
    with pytest.raises(ConfigError, match="hints must be below group_size") as e:
        load_config("configs/default.toml", ["stage.manager.hints=8"])
    assert "\n" not in str(e.value)
    assert load_config("configs/default.toml", ["stage.manager.hints=2"]).stage.manager.hints == 2
