"""Token-budget dynamic batching: a rank's groups cut into micro-batches.

A rank trains on its own groups (rl/records.py). Its sequences, in group order, get flat local
indices; they are cut into k micro-batches of about `micro_batch_tokens` each. k must be the same on
every rank (FSDP collectives must line up), so the learner agrees on it with one scalar all-reduce
(the max), and a rank with less work gets smaller, possibly empty (dummy) micro-batches.

Two layouts. "packed": all sequences of a micro-batch in one row, boundaries from position_ids, for
backends with variable-length kernels (flash_attention_2); no padding at all. "rows": one row per
unit, padded up to a multiple of `pad_bucket` (few distinct shapes), described by a PrefixLayout for
memr1's prefix attention (prefix_attention.py, over SDPA). With prompt sharing a unit is a whole
group: the row holds the prompt once, then each response, and each response attends to the prompt
and to itself only. Causality makes this exact, and the prompt is computed once instead of G times
(and counts once against the token budget). Without sharing (or packed) a unit is one prompt + response.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from memr1.engine.training.prefix_attention import PrefixLayout, layout
from memr1.rl.records import TrainBatch


@dataclass
class Seq:
    """One prompt + response of a rank's batch, by its flat local index."""
    index: int
    prompt: torch.Tensor                    # [P] long
    response: torch.Tensor                  # [R] long
    behav: torch.Tensor | None              # [R] the generator's log-probs, or None


@dataclass
class Micro:
    """One forward pass worth of sequences. Per-token tensors are flat over trained response tokens."""
    input_ids: torch.Tensor                 # [rows, L]
    position_ids: torch.Tensor              # [rows, L]
    prefix: PrefixLayout | None             # the rows layout's attention pattern; None when packed
    index: torch.Tensor                     # [M] flat hidden-state row predicting each target
    targets: torch.Tensor                   # [M]
    seq_ids: torch.Tensor                   # [M] sequence of each token, local to this micro-batch
    pos_in_seq: torch.Tensor                # [M] position of the token within its response
    gseq: torch.Tensor                      # [num_seqs] flat local index (in the rank's batch) of each sequence
    behav_logp: torch.Tensor | None         # [M]
    num_seqs: int
    dummy: bool = False
    advantages: torch.Tensor | None = None  # [M], filled by the algorithm
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    kl: torch.Tensor | None = None          # PPO with the KL in the reward

    def model_inputs(self) -> dict:
        """The keywords of a model call on this micro-batch (transformers hands `prefix` to attention)."""
        extra = {} if self.prefix is None else {"prefix": self.prefix}
        return dict(input_ids=self.input_ids, position_ids=self.position_ids, **extra)


@dataclass
class Plan:
    """A learner's micro-batch plan for one TrainBatch on one rank (`Learner.plan`)."""
    work: TrainBatch                        # the groups computed
    signal: TrainBatch                      # the groups with a nonzero advantage (GRPO; else the batch)
    seq_adv: torch.Tensor | None            # GRPO: one advantage per sequence of `work`; PPO: None
    units: list[list[Seq]]                  # `work`'s sequences as units (a group, or one sequence)
    micros: list[Micro]                     # as many on every rank; a rank short of work gets dummies

    @property
    def count(self) -> int:
        return len(self.micros)


def units_of(batch: TrainBatch, share: bool) -> list[list[Seq]]:
    """The batch's sequences grouped into units: a whole group when prompts are shared, else one each."""
    units, index = [], 0
    for g in batch.groups:
        prompt = torch.as_tensor(g.prompt_ids, dtype=torch.long)
        seqs = []
        for j, response in enumerate(g.responses):
            behav = None if g.behav_logprobs is None else torch.as_tensor(g.behav_logprobs[j], dtype=torch.float32)
            seqs.append(Seq(index, prompt, torch.as_tensor(response, dtype=torch.long), behav))
            index += 1
        units += [seqs] if share else [[s] for s in seqs]
    return units


def unit_cost(unit: list[Seq]) -> int:
    """Token positions the unit computes: its prompt once, then every response."""
    return len(unit[0].prompt) + sum(len(s.response) for s in unit)


def micro_count(units: list[list[Seq]], budget: int) -> int:
    """How many micro-batches this rank's units need at `budget` tokens each (at least 1)."""
    return max(1, min(len(units), -(-sum(unit_cost(u) for u in units) // budget)))


def split_units(units: list[list[Seq]], k: int) -> list[list[list[Seq]]]:
    """k contiguous, token-balanced parts of whole units (a unit goes where its first token falls);
    a part may be empty."""
    parts, before = [[] for _ in range(k)], 0
    total = sum(unit_cost(u) for u in units)
    for unit in units:
        parts[min(k - 1, before * k // max(total, 1))].append(unit)
        before += unit_cost(unit)
    return parts


def build_micro(units: list[list[Seq]], packed: bool, bucket: int, device: torch.device) -> Micro:
    if not units:  # two tokens, one target, zero weight: only there to keep collectives in step
        z = torch.zeros(1, 2, dtype=torch.long, device=device)
        one = torch.zeros(1, dtype=torch.long, device=device)
        prefix = None if packed else layout([(1, [1])], 2, device)
        return Micro(z, torch.arange(2, device=device)[None], prefix, one, one, one, one,
                     torch.zeros(1, dtype=torch.long), torch.zeros(1, device=device), 1, dummy=True)
    rows, index, targets, seq_ids, pos, behav, gseq = [], [], [], [], [], [], []
    width = -(-max(unit_cost(u) for u in units) // bucket) * bucket
    offset, local = 0, 0
    for unit in units:
        prompt = unit[0].prompt
        p = len(prompt)
        ids, posn, start = [prompt], [torch.arange(p)], p
        for s in unit:
            r = len(s.response)
            # response token t sits at p + t of its own sequence; the hidden state one before predicts it
            src = torch.arange(p - 1, p - 1 + r)
            index.append(offset + torch.where(src < p, src, start + src - p))
            targets.append(s.response)
            seq_ids.append(torch.full((r,), local))
            pos.append(torch.arange(r))
            if s.behav is not None:
                behav.append(s.behav)
            ids.append(s.response)
            posn.append(torch.arange(p, p + r))
            gseq.append(s.index)
            start += r
            local += 1
        rows.append((torch.cat(ids), torch.cat(posn)))
        offset += len(rows[-1][0]) if packed else width
    if packed:
        input_ids, position_ids, prefix = (torch.cat([r[0] for r in rows])[None],
                                           torch.cat([r[1] for r in rows])[None], None)
    else:
        input_ids = torch.zeros(len(rows), width, dtype=torch.long)
        position_ids = torch.zeros(len(rows), width, dtype=torch.long)
        for r, (x, pp) in enumerate(rows):
            input_ids[r, :len(x)], position_ids[r, :len(x)] = x, pp
        prefix = layout([(len(u[0].prompt), [len(s.response) for s in u]) for u in units], width, device)
    to = lambda t: torch.cat(t).to(device)
    has_behav = all(s.behav is not None for u in units for s in u)
    return Micro(input_ids.to(device), position_ids.to(device), prefix, to(index), to(targets), to(seq_ids),
                 to(pos), torch.tensor(gseq), to(behav) if has_behav else None, local)
