"""One scored batch of each stage kind, built by the stages themselves on scripted generators (no model):
call-level manager and answer RL, the episode stage with both levels and unequal level weights, the
warm start (scripted targets) and rejection sampling on the manager's rollout. Rewards vary within
groups, so the advantages are not all zero. Deterministic: the same batches on every run."""
import json
import zlib

from memr1.memory_store import HashEmbedder
from memr1.rl.task.agents.answer import AnswerConfig
from memr1.rl.task.agents.manager import ManagerConfig
from memr1.rl.algos.rejection import rejection_batch
from memr1.rl.task.data import load_conversations
from memr1.rl.task.stages.episode import EpisodeStage
from memr1.rl.task.episodes import EpisodeConfig, episode_items
from memr1.rl.task.facts import oracle_facts
from memr1.rl.generation import SamplingConfig
from memr1.rl.task.train_items import ItemsConfig, answer_items, manager_calls, manager_items, oracle_bank
from memr1.rl.task.rewards import RewardConfig
from memr1.rl.task.stages.calls import AnswerStage, ManagerStage, StageConfig
from memr1.rl.task.turns import Task
from memr1.rl.task.stages.warm import WarmStage
from memr1.rl.task.stages.context import StageContext
from scripted import ScriptedGenerator

TASK = Task(manager=ManagerConfig(top_k=5, turns_per_call=2, max_new_tokens=64),
            answer=AnswerConfig(max_new_tokens=8, distill=False))
KINDS = ("manager", "answer", "episode", "warm", "rs")


def _pick(key: str, n: int) -> int:
    return zlib.crc32(key.encode()) % n


class _Tokenizer:
    """What WarmStage asks of a tokenizer: a chat template, an encoder and an end-of-turn id."""
    eos_token_id = 2

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return json.dumps(messages)

    def encode(self, text, add_special_tokens=False):
        return [3 + zlib.crc32(text.encode()) % 997, 3 + len(text) % 991]


def _manager_reply(call, i, j):
    """Each completion ADDs a note or writes nothing, by its position, so forks' banks differ."""
    if _pick(f"{call}:{i}:{j}", 3) == 0:
        return '{"memory": []}'
    return json.dumps({"memory": [{"id": "90", "text": f"note {call}-{i}-{j}", "event": "ADD"}]})


class _Answerer(ScriptedGenerator):
    """Answers a prompt's question right or wrong by a hash of the whole prompt (the bank it shows
    included, so forks with different banks score differently)."""

    def __init__(self, convs):
        super().__init__()
        self.golds = {qa.question: qa.answer for c in convs for qa in c.qa}
        self.reply = self.answer

    def answer(self, call, i, j):
        prompt = json.dumps(self.calls[call][i])
        gold = next((a for q, a in self.golds.items() if json.dumps(q)[1:-1] in prompt), "none")
        return f"Answer: {gold}" if _pick(f"{prompt}:{j}", 3) else "Answer: none"


def batches() -> dict:
    """kind -> the TrainBatch that stage kind hands the learner."""
    convs = load_conversations(None, 10, split="train")
    facts = {c.sample_id: oracle_facts(c) for c in convs}
    embedder = HashEmbedder(64)
    cfg = StageConfig(steps=1, prompts_per_step=4, group_size=4)
    specs = manager_calls(convs[:3], facts, 2)
    m_items = manager_items(specs, [oracle_bank(s, s.conv, embedder) for s in specs], ItemsConfig(), seed=0)
    a_items = answer_items(convs[:3], {c.sample_id: oracle_bank(None, c, embedder) for c in convs[:3]}, seed=0)
    reward = RewardConfig(kind="f1")
    sampling = SamplingConfig()
    ctx = StageContext(embedder, TASK, reward, sampling)
    manager = ManagerStage(m_items, _Answerer(convs), ctx, cfg)
    m_rollout = manager.rollout(0, ScriptedGenerator(reply=_manager_reply))
    answer = AnswerStage(a_items, ctx, cfg)
    a_rollout = answer.rollout(0, _Answerer(convs))
    e_items = episode_items(convs, facts, 2, sessions=2)[:2]
    episode = EpisodeStage(lambda s: e_items, _Answerer(convs), ctx,
                           StageConfig(steps=1, prompts_per_step=2, group_size=4),
                           EpisodeConfig(sessions=2, inner_n=3, reroll_prob=1.0, compression=0.05,
                                         global_weight=0.3, local_weight=0.7))
    e_rollout = episode.rollout(0, ScriptedGenerator(reply=_manager_reply))
    warm = WarmStage("answer", a_items, {c.sample_id: c for c in convs}, ctx, _Tokenizer(),
                     StageConfig(steps=1, prompts_per_step=3, group_size=1))
    w_rollout = warm.rollout(0, ScriptedGenerator())
    return {"manager": m_rollout.batch, "answer": a_rollout.batch, "episode": e_rollout.batch,
            "warm": w_rollout.batch, "rs": rejection_batch(m_rollout).batch}
