"""What the stages of one run share, so a stage's constructor takes this, its own settings and its
items, not a dozen loose arguments. engine/assembly.py builds one per stage (the role's sampling, greedy
for validation); tests build their own."""
from dataclasses import dataclass, field, replace
from typing import Any

from memr1.rl.generation import SamplingConfig
from memr1.rl.task.rewards import RewardConfig
from memr1.rl.task.turns import Task


@dataclass(frozen=True)
class StageContext:
    embedder: Any                    # the banks' embedder (memory_store/embed.py)
    task: Task                       # the manager's and the answer agent's prompt and parse settings
    reward: RewardConfig = field(default_factory=RewardConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)   # the role's rollout sampling
    judge: Any = None                # an LLM judge (engine/generation/openai_chat.py) when reward.kind is judge
    rank: int = 0                    # data parallelism: this rank rolls out its share of each step
    world: int = 1
    seed: int = 0                    # the run's seed (the episode stage's re-roll draws)

    def with_sampling(self, sampling: SamplingConfig) -> "StageContext":
        return replace(self, sampling=sampling)
