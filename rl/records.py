"""The records that cross stages: a stage's rollout turns into groups, the loop queues them, the
learner trains on them. Defined once here; every field says what it holds.

    Stage.rollout(step)  ->  Rollout(batch=TrainBatch(groups=[Group, ...]), metrics, samples=[Sample, ...])
    Loop                 ->  learner.train_step(rollout.batch)
    memr1 rollout        ->  one Parquet row per Sample, its tokens and reward read from its Group

A Group is the unit down to the learner: one prompt and the G responses sampled for it. The prompt's
token ids are stored once, so the learner computes each prompt once per group without having to find
out which sequences share it. Under data parallelism each rank's TrainBatch holds its own groups only.
Stages emit rewards and, where a Group is not itself the comparison group, each response's Credit;
rl/algos/advantages.py alone turns them into advantages.
"""
from __future__ import annotations

from dataclasses import dataclass, field

LEVELS = ("call", "global", "local", "target")


@dataclass(frozen=True)
class Credit:
    """How one response's reward counts towards its advantage (rl/algos/advantages.py). A Group without
    credit is one comparison group of call-level responses, each scored on its own, weight 1."""
    level: str = "call"   # "call" | "global" | "local" (episodes): compared within `group`; "target": a
                          # supervised target (warm start, control, rejection sampling), advantage = weight
    group: int = 0        # the comparison group, an id unique across the batch's levels
    unit: int = 0         # what one reward scored, an id unique in the batch: responses of one unit share
                          # that reward and count once in their group (an episode session's calls); units
                          # enter their group in id order
    weight: float = 1.0   # the level's weight, multiplying the advantage

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ValueError(f"Credit.level={self.level!r}; expected one of {LEVELS}")


TARGET = Credit("target")   # a scripted or kept reply trained with the supervised loss (advantage 1)


@dataclass
class Group:
    """One prompt and its G responses, scored."""
    prompt_ids: list[int]                 # the prompt's token ids, once for the whole group
    responses: list[list[int]]            # G response token-id lists (what the policy generated)
    behav_logprobs: list[list[float]] | None  # per response token: its log-prob under the sampling
                                              # distribution (None: not sampled, e.g. a warm-start target;
                                              # NaN: a hint's token, rl/task/hints.py)
    rewards: list[float]                  # G scalar rewards, the sum of each response's breakdown
    breakdown: dict[str, list[float]] = field(default_factory=dict)  # reward part -> G values (for logs)
    truncated: list[bool] = field(default_factory=list)  # response i hit the token budget
    credit: list[Credit] | None = None    # per response (see Credit); None: call-level, the Group is
                                          # the comparison group
    source: str = ""                      # what the prompt came from ("conv-26 D3:4"), for logs

    def __post_init__(self):
        g = len(self.responses)
        if not self.prompt_ids:
            raise ValueError(f"Group {self.source!r}: the prompt has no tokens")
        if g == 0 or len(self.rewards) != g:
            raise ValueError(f"Group {self.source!r}: {g} responses but {len(self.rewards)} rewards")
        if self.behav_logprobs is not None and [len(x) for x in self.behav_logprobs] != [len(r) for r in self.responses]:
            raise ValueError(f"Group {self.source!r}: behav_logprobs must hold one value per response token")
        if self.credit is not None and len(self.credit) != g:
            raise ValueError(f"Group {self.source!r}: {len(self.credit)} credits for {g} responses")
        for part, values in self.breakdown.items():
            if len(values) != g:
                raise ValueError(f"Group {self.source!r}: reward part {part!r} has {len(values)} values for {g}")

    def __len__(self) -> int:
        return len(self.responses)

    @property
    def advantages(self) -> list[float] | None:
        """The advantages the stage fixed: a supervised group's target weights; None where the algorithm
        derives them from the rewards (rollout files show it)."""
        if self.credit is None or any(c.level != "target" for c in self.credit):
            return None
        return [c.weight for c in self.credit]

    @property
    def response_tokens(self) -> int:
        return sum(len(r) for r in self.responses)


@dataclass
class TrainBatch:
    """What one learner step trains on (on this rank): whole groups, and the weight version they were
    sampled with (the learner reports staleness against it)."""
    groups: list[Group]
    weight_version: int = 0

    @property
    def num_seqs(self) -> int:
        return sum(len(g) for g in self.groups)

    @property
    def response_tokens(self) -> int:
        return sum(g.response_tokens for g in self.groups)

    @property
    def positions(self) -> int:
        """Token positions the learner computes with prompt sharing: each prompt once per group."""
        return sum(len(g.prompt_ids) + g.response_tokens for g in self.groups)


@dataclass
class Sample:
    """What one completion of a step did, beside its tokens: `memr1 rollout` writes one Parquet row
    per Sample (engine/rollout_files.py), training ignores them. Its prompt, tokens, log-probs, reward
    and reward parts stay in its Group (`batch.groups[group]`, response `index`), written once."""
    group: int                   # its Group's index in the step's TrainBatch
    index: int                   # its response's index in that Group
    item: str                    # the item it answers (the Group's source, e.g. "conv-3 D2:4")
    conversation: str
    text: str                    # the completion's text
    call_turns: list[str] = field(default_factory=list)  # manager: the dialogue turns the call reads
    level: str = "call"          # "call" (call-level manager, answer agent) | "global" | "local" (episodes)
    status: str = "ok"           # manager: ManagerOutcome.status; answer: ok | no_answer_tag
    invalid_ops: int = 0
    applied: bool = False        # manager: its ops reached the bank
    events: list[str] = field(default_factory=list)   # manager: parsed events, NONE included
    ops: list[dict] = field(default_factory=list)     # manager: {"event", "id", "text"} of each store op
    refs: list[dict] = field(default_factory=list)    # manager: {"event", "local_id", "old_memory"} of each
                                                      # parsed UPDATE, DELETE and NONE (turns.ManagerOutcome)
    shown_ids: list[int] = field(default_factory=list)    # manager: the bank id of each shown local id
    shown_texts: list[str] = field(default_factory=list)  # manager: ... and its text as shown
    answers: list[str] = field(default_factory=list)  # the answers scored: the frozen answerer's on the
                                                      # completion's bank (manager), its own (answer)
    golds: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)  # each answer's score (reward.kind)
    bank_before: int = 0         # memories in the bank the prompt was built from
    bank_after: int = 0          # ... after the completion's ops


@dataclass
class Rollout:
    """A stage's output for one step, as the loop queues it."""
    batch: TrainBatch
    metrics: dict = field(default_factory=dict)  # per-step means: reward and its parts, EM, F1, parse
                                                 # failures, op mix, length-cap rates, gen_s, score_s, ...
    samples: list[Sample] = field(default_factory=list)  # one per completion (what `memr1 rollout` keeps)
    step: int = -1                 # the loop step it belongs to (set by the loop)
    weight_version: int = -1       # the generator's weights when it was sampled (set by the loop)


@dataclass
class RolloutFailure:
    """A rollout that raised instead of returning: the loop queues it in the rollout's place, and under
    data parallelism the ranks agree on it (engine/training/dist.py) before the loop handles it."""
    step: int
    error: BaseException | None     # None once it has crossed ranks (exceptions may not pickle)
    trace: str
    what: str = ""                  # "ValueError: ...": what the message shows, also from another rank
    rank: int | None = None         # the rank it failed on, under data parallelism
    fatal: bool = False             # the producer itself died: stop even with on_rollout_error="skip"

    def __post_init__(self):
        if not self.what and self.error is not None:
            self.what = f"{type(self.error).__name__}: {self.error}"
