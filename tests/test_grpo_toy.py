"""A tiny GRPO run: reward 1 when the completion contains a target token; the mean reward must rise."""
import torch

from memr1.engine.training.config import LearnerConfig
from memr1.engine.training.learner import Learner
from memr1.rl.records import Group, TrainBatch


TARGET, PROMPTS, GROUP, NEW = 7, 4, 8, 5


@torch.no_grad()
def sample(lm, prompts, generator):
    """Plain ancestral sampling at temperature 1, recording each sampled token's log-prob."""
    seqs = prompts.repeat_interleave(GROUP, 0)
    logps = torch.zeros_like(seqs, dtype=torch.float32)
    for _ in range(NEW):
        logits = lm(seqs).logits[:, -1].float()
        probs = torch.softmax(logits, -1)
        tok = torch.multinomial(probs, 1, generator=generator)
        seqs = torch.cat([seqs, tok], 1)
        logps = torch.cat([logps, probs.gather(1, tok).log()], 1)
    return seqs, logps


def test_grpo_raises_mean_reward(tiny):
    torch.manual_seed(0)
    learner = Learner(LearnerConfig(), tiny, lr=3e-3)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, 32, (PROMPTS, 3), generator=g)
    rewards_per_step = []
    for _ in range(12):
        seqs, logps = sample(learner.policy.lm, prompts, g)
        rewards = (seqs[:, 3:] == TARGET).any(1).float()
        groups = [Group(prompts[i].tolist(), seqs[i * GROUP:(i + 1) * GROUP, 3:].tolist(),
                        logps[i * GROUP:(i + 1) * GROUP, 3:].tolist(), rewards[i * GROUP:(i + 1) * GROUP].tolist())
                  for i in range(PROMPTS)]
        batch = TrainBatch(groups, weight_version=learner.version)
        metrics = learner.train_step(batch)
        assert metrics["staleness"] == 0 and metrics["loss"] == metrics["loss"]
        rewards_per_step.append(rewards.mean().item())
    start, end = sum(rewards_per_step[:3]) / 3, sum(rewards_per_step[-3:]) / 3
    assert end > start + 0.3, rewards_per_step
