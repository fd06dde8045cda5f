"""Online rejection-sampling fine-tuning (RFT): the control RL is measured against when no labels exist.

It runs in the same loop as its RL stage, on the same prompts and the same sampled completions (the RL
stage's rollout, unchanged), and keeps, per group, the best-rewarded completion when its reward is above
zero (ties to the first sampled); groups with no positive reward teach nothing and are skipped. The kept
completions are trained with the supervised loss: targets of weight 1 (advantage 1, rl/algos/advantages.py),
no behaviour log-probs, so the loss on a ratio of 1 has the gradient of their negative log-likelihood
(as rl/task/stages/warm.py's scripted replies). RL sees
the same rollouts, but learns from every completion's reward relative to its group's.
"""
from memr1.rl.records import Credit, Group, Rollout, TrainBatch


def best_of(group: Group) -> int | None:
    """The index of the group's best completion if its reward is above zero (the first of equals)."""
    best = max(range(len(group)), key=lambda i: (group.rewards[i], -i))
    return best if group.rewards[best] > 0 else None


def keep_best(group: Group, i: int, weight: float) -> Group:
    """Completion `i` of `group` alone, as a supervised target of `weight` (its advantage)."""
    return Group(prompt_ids=group.prompt_ids, responses=[group.responses[i]], behav_logprobs=None,
                 rewards=[group.rewards[i]], breakdown={k: [v[i]] for k, v in group.breakdown.items()},
                 truncated=group.truncated[i:i + 1], credit=[Credit("target", weight=weight)],
                 source=group.source)


def rejection_batch(rollout: Rollout) -> Rollout:
    """`rollout` as RFT trains it: each group's best positive completion. When no group has one, the
    batch is the first group's first completion at weight 0, a step that changes no weight (the
    learner needs a sequence to agree on a step with its ranks). The step's metrics stay the RL
    rollout's (what the policy sampled), plus `rs_kept`: the share of groups kept."""
    groups = rollout.batch.groups
    kept = [keep_best(g, i, 1.0) for g in groups if (i := best_of(g)) is not None]
    share = len(kept) / len(groups) if groups else 0.0
    if not kept and groups:
        kept = [keep_best(groups[0], 0, 0.0)]
    return Rollout(TrainBatch(kept, rollout.batch.weight_version), {**rollout.metrics, "rs_kept": share},
                   [], rollout.step, rollout.weight_version)


class RejectionStage:
    """An RL stage's rollouts, trained by rejection sampling (module doc)."""

    def __init__(self, stage, name: str):
        self.stage, self.name = stage, name

    def rollout(self, step: int, generator) -> Rollout:
        return rejection_batch(self.stage.rollout(step, generator))
