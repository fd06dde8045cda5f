"""Token-budget dynamic batching: a learner rank's share of a batch cut into micro-batches.

Each rank takes a contiguous 1/world of the sequences and cuts it into k micro-batches of about
`micro_batch_tokens` each; k is the same on every rank (FSDP collectives must line up), so a rank with
less work gets smaller, possibly empty (dummy) micro-batches.

Two layouts. "packed": all sequences of a micro-batch in one row, boundaries from position_ids, for
backends with variable-length kernels (flash_attention_2); no padding at all. "rows": one row per
*prefix group*, padded up to a multiple of `pad_bucket` (few distinct shapes), with an explicit 4-D
mask, for mask-based backends (sdpa, eager).

A prefix group is a run of consecutive sequences with the same prompt (the tokens before the first
trained one), e.g. the G completions of one GRPO prompt: the row holds the prompt once, then each
completion, and each completion attends to the prompt and to itself only. Causality makes this exact,
and the prompt is computed once instead of G times (and counts once against the token budget).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Micro:
    """One forward pass worth of sequences. Per-token tensors are flat over trained response tokens."""
    input_ids: torch.Tensor                 # [rows, L]
    position_ids: torch.Tensor              # [rows, L]
    attention_mask: torch.Tensor | None     # [rows, 1, L, L] bool (True = attend); None when packed
    index: torch.Tensor                     # [M] flat hidden-state row predicting each target
    targets: torch.Tensor                   # [M]
    seq_ids: torch.Tensor                   # [M] local sequence of each token
    pos_in_seq: torch.Tensor                # [M] rank of the token among its sequence's trained tokens
    gseq: torch.Tensor                      # [num_seqs] global index of each local sequence
    behav_logp: torch.Tensor | None         # [M]
    num_seqs: int
    dummy: bool = False
    advantages: torch.Tensor | None = None  # [M], filled by the algorithm
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    kl: torch.Tensor | None = None          # PPO with the KL in the reward


def prompt_len(mask: torch.Tensor) -> int:
    hits = torch.nonzero(mask)
    return int(hits[0]) if len(hits) else len(mask)


def prefix_groups(batch, seqs: list[int], share: bool) -> list[list[int]]:
    """Runs of consecutive sequences with an identical prompt (singletons when share is off)."""
    groups, key = [], None
    for i in seqs:
        p = prompt_len(batch.response_mask[i])
        if share and groups and key[0] == p and torch.equal(batch.input_ids[i][:p], key[1]):
            groups[-1].append(i)
        else:
            groups.append([i])
            key = (p, batch.input_ids[i][:p])
    return groups


def unit_cost(batch, unit: list[int], packed: bool) -> int:
    if packed:
        return sum(int(batch.input_ids[i].numel()) for i in unit)
    p = prompt_len(batch.response_mask[unit[0]])
    return p + sum(int(batch.input_ids[i].numel()) - p for i in unit)


def split_parts(batch, n: int, rank: int, world: int, budget: int, packed: bool, share: bool) -> list[list[int]]:
    """This rank's contiguous share of sequences cut into k micro-batches of whole prefix groups; k is
    equal on every rank (FSDP collectives must line up), set by the token budget of the busiest rank.
    A part may be empty."""
    per = n // world
    units = [prefix_groups(batch, list(range(r * per, (r + 1) * per)), share and not packed) for r in range(world)]
    costs = [[unit_cost(batch, u, packed) for u in us] for us in units]
    k = max(min(len(us), max(1, -(-sum(c) // budget))) for us, c in zip(units, costs))
    mine, total = units[rank], sum(costs[rank])
    parts, before = [[] for _ in range(k)], 0
    for unit, c in zip(mine, costs[rank]):  # a unit goes where its first token falls: contiguous, balanced
        parts[min(k - 1, before * k // max(total, 1))].extend(unit)
        before += c
    return parts


def build_micro(batch, seqs: list[int], packed: bool, share: bool, bucket: int, device: torch.device) -> Micro:
    if not seqs:  # two tokens, one target, zero weight: only there to keep collectives in step
        z = torch.zeros(1, 2, dtype=torch.long, device=device)
        one = torch.zeros(1, dtype=torch.long, device=device)
        return Micro(z, torch.arange(2, device=device)[None], None, one, one, one, one,
                     torch.zeros(1, dtype=torch.long), torch.zeros(1, device=device), 1, dummy=True)
    units = [[i] for i in seqs] if packed else prefix_groups(batch, seqs, share)
    rows, index, targets, seq_ids, pos, behav = [], [], [], [], [], []
    width = max(unit_cost(batch, u, packed=False) for u in units)
    width = -(-width // bucket) * bucket
    offset, local = 0, 0
    for unit in units:
        p = prompt_len(batch.response_mask[unit[0]])
        ids, posn, seg = [batch.input_ids[unit[0]][:p].long().cpu()], [torch.arange(p)], [torch.zeros(p, dtype=torch.long)]
        start = p
        for j, i in enumerate(unit):
            x, m = batch.input_ids[i].long().cpu(), batch.response_mask[i].bool().cpu()
            t = torch.nonzero(m).squeeze(1)  # trained positions; the hidden state at t-1 predicts t
            src = t - 1
            index.append(offset + torch.where(src < p, src, start + src - p))
            targets.append(x[t])
            seq_ids.append(torch.full_like(t, local))
            pos.append(torch.arange(len(t)))
            if batch.behav_logp is not None:
                behav.append(batch.behav_logp[i].float().cpu()[t])
            ids.append(x[p:])
            posn.append(torch.arange(p, len(x)))
            seg.append(torch.full((len(x) - p,), j + 1))
            start += len(x) - p
            local += 1
        rows.append((torch.cat(ids), torch.cat(posn), torch.cat(seg)))
        offset += len(rows[-1][0]) if packed else width
    if packed:
        input_ids, position_ids, attention_mask = (torch.cat([r[0] for r in rows])[None],
                                                   torch.cat([r[1] for r in rows])[None], None)
    else:
        input_ids = torch.zeros(len(rows), width, dtype=torch.long)
        position_ids = torch.zeros(len(rows), width, dtype=torch.long)
        seg_ids = torch.full((len(rows), width), -1)
        for r, (x, pp, sg) in enumerate(rows):
            input_ids[r, :len(x)], position_ids[r, :len(x)], seg_ids[r, :len(x)] = x, pp, sg
        q, k = seg_ids[:, :, None], seg_ids[:, None, :]
        causal = torch.ones(width, width, dtype=torch.bool).tril()
        attention_mask = causal & (k >= 0) & ((k == 0) | (k == q))
        attention_mask |= torch.eye(width, dtype=torch.bool)  # padding rows attend to themselves: no NaN
        attention_mask = attention_mask[:, None].to(device)
    to = lambda t: torch.cat(t).to(device)
    return Micro(input_ids.to(device), position_ids.to(device), attention_mask, to(index), to(targets), to(seq_ids),
                 to(pos), torch.tensor(seqs), to(behav) if behav else None, len(seqs))
