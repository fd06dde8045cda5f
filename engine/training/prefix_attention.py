"""Prefix attention: the rows layout's attention, which computes only the pairs that can attend.

A row of the rows layout (batching.py) holds a prompt and then the responses of its group; each
response attends to the prompt and, causally, to itself. A dense [L, L] mask over the row would make
SDPA compute every pair of the row, most of them masked: at G = 16 responses of 128 tokens after a
256-token prompt, 2,304² pairs, where the two calls below compute 256²/2 + 16 × 128 × 384 (6.5x fewer).

So each layer makes two SDPA calls instead:
- the prompts, the first `prompt_width` positions of every row, causally (no mask at all);
- the responses stacked as a batch [responses, Rmax], each against its row's prompt keys and then its
  own keys, under a small [responses, 1, Rmax, prompt_width + Rmax] mask.
The outputs land back at their row positions. Padding positions and a row's positions past its own
prompt inside `prompt_width` get outputs that nothing reads: no real query ever attends to them (they
are masked keys) and no target sits on them. Every real query keeps at least one unmasked key (its
row's first token), so no softmax row is empty. When every row holds one response (prompt sharing
off), a row is one causal sequence: a single causal SDPA call over the rows, with nothing gathered.

Registered with transformers as the attention implementation "memr1_prefix"; the layout travels as the
model call's `prefix` keyword, which transformers hands to every attention call. A call without it (a
test sampling from the learner's model, say) is plain SDPA with transformers' own sdpa mask.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "memr1_prefix"


@dataclass
class PrefixLayout:
    """Where each response of a [rows, width] micro-batch sits, as index tensors built once per micro."""
    prompt_width: int        # the longest prompt; every row's prompt starts at position 0
    gather: torch.Tensor     # [N, Rmax] flat (row * width + position) index of each response token (pad: row start)
    row: torch.Tensor        # [N] the row each response sits in
    mask: torch.Tensor       # [N, 1, Rmax, prompt_width + Rmax] bool, True = attend
    dst: torch.Tensor        # [V] flat index of every real response token
    src: torch.Tensor        # [V] the same token's place in the flattened [N * Rmax] response grid
    single: bool             # every row holds one response: each row is just causal


def layout(rows: list[tuple[int, list[int]]], width: int, device: torch.device) -> PrefixLayout:
    """`rows`: (prompt length, [response lengths]) per row, responses in row order after the prompt."""
    p_max = max(p for p, _ in rows)
    r_max = max(r for _, lengths in rows for r in lengths)
    t = torch.arange(r_max)
    gather, row, valid_prompt, length = [], [], [], []
    for i, (p, lengths) in enumerate(rows):
        start = p
        for r in lengths:
            gather.append(torch.where(t < r, i * width + start + t, i * width))
            row.append(i)
            valid_prompt.append(torch.arange(p_max) < p)
            length.append(r)
            start += r
    gather, length = torch.stack(gather), torch.tensor(length)
    own = (t[None, :, None] >= t[None, None, :]) & (t[None, None, :] < length[:, None, None])  # [N, Rmax, Rmax]
    prompt = torch.stack(valid_prompt)[:, None, :].expand(-1, r_max, -1)                     # [N, Rmax, Pmax]
    mask = torch.cat([prompt, own], 2)[:, None]
    real = t[None, :] < length[:, None]                                                       # [N, Rmax]
    return PrefixLayout(p_max, gather.to(device), torch.tensor(row, device=device), mask.to(device),
                        gather[real].to(device), real.reshape(-1).nonzero().squeeze(1).to(device),
                        all(len(lengths) == 1 for _, lengths in rows))


def prefix_attention(module, query, key, value, attention_mask, prefix: PrefixLayout | None = None, **kwargs):
    """transformers' attention signature: query [B, H, L, D], key/value [B, Hkv, L, D]; returns
    ([B, L, H, D], None). With a layout, `attention_mask` (what transformers made of position_ids) is unused."""
    if prefix is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    kwargs.pop("is_causal", None)
    if prefix.single:  # padding sits at the row ends, where causality keeps it from every real query
        return sdpa_attention_forward(module, query, key, value, None, is_causal=True, **kwargs)
    b, h, length, d = query.shape
    p = prefix.prompt_width
    out_prompt, _ = sdpa_attention_forward(module, query[:, :, :p], key[:, :, :p], value[:, :, :p], None,
                                           is_causal=True, **kwargs)                    # [B, P, H, D]

    # index_select rather than advanced indexing: its backward (index_add_) is several times faster on CPU
    def grid(x):  # [B, heads, L, D] -> [N, heads, Rmax, D]
        flat = x.transpose(1, 2).reshape(b * length, x.shape[1], d)
        return flat.index_select(0, prefix.gather.view(-1)).view(*prefix.gather.shape, x.shape[1], d).transpose(1, 2)

    keys = torch.cat([key[:, :, :p].index_select(0, prefix.row), grid(key)], 2)
    values = torch.cat([value[:, :, :p].index_select(0, prefix.row), grid(value)], 2)
    out_resp, _ = sdpa_attention_forward(module, grid(query), keys, values, prefix.mask,
                                         is_causal=False, **kwargs)                    # [N, Rmax, H, D]
    out = torch.cat([out_prompt, out_prompt.new_zeros(b, length - p, h, d)], 1).reshape(b * length, h, d)
    out = out.index_copy(0, prefix.dst, out_resp.reshape(-1, h, d).index_select(0, prefix.src))
    return out.view(b, length, h, d), None


AttentionInterface.register(NAME, prefix_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)  # what a call without a layout gets
