"""Sequence packing for SFT without cross-contamination (its loss: ``core.train.sft_loss``).

Samples of different lengths are packed first-fit, longest first, into rows of at most ``max_tokens`` tokens
(padding otherwise spent on short samples is spent on other samples' tokens). In a row every sample keeps what it
would have alone: its positions restart at 0 (``position_ids``) and its tokens attend only to earlier tokens of the
same sample (``attention_mask``: a block-diagonal causal mask, (R, 1, T, T), True = attend), so a packed sample's
loss and gradients are those of the sample run alone (tests/sft/test_packing.py: equal to transformers' own loss
of each sample, and unchanged when its neighbours change).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.sft.data import Sample


@dataclass
class Packed:
    input_ids: torch.Tensor       # (R, T) long, pad 0
    position_ids: torch.Tensor    # (R, T) long, restarting at 0 for each sample
    segment: torch.Tensor         # (R, T) long: the sample's index in its row, -1 on padding
    loss_mask: torch.Tensor       # (R, T) float: 1 on the tokens trained

    def attention_mask(self) -> torch.Tensor:
        """(R, 1, T, T) bool: query t attends key s <= t of the same sample."""
        T = self.segment.shape[1]
        same = (self.segment[:, :, None] == self.segment[:, None, :]) & (self.segment[:, None, :] >= 0)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        return (same & causal)[:, None]


def pack(samples: list[Sample], max_tokens: int, multiple: int = 1) -> list[list[int]]:
    """Rows of sample indices, each row's samples at most ``max_tokens`` tokens together (first-fit, longest
    first); ``multiple``: as many rows as a multiple of it (the DP ranks split the rows evenly, and a repeated row
    would train twice): the fullest rows give up samples to new rows. A sample longer than ``max_tokens`` is an
    error naming it, and so are fewer samples than ``multiple``."""
    if len(samples) < multiple:
        raise ValueError(f"{len(samples)} SFT samples cannot fill {multiple} rows (one per data-parallel rank)")
    order = sorted(range(len(samples)), key=lambda i: -len(samples[i].ids))
    rows: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = len(samples[i].ids)
        if n > max_tokens:
            raise ValueError(f"SFT sample {i} has {n} tokens, more than the {max_tokens} of a packed row "
                             "(data.max_tokens): raise it, or drop or cut long samples")
        k = next((r for r, left in enumerate(room) if left >= n), None)
        if k is None:
            rows.append([])
            room.append(max_tokens)
            k = len(rows) - 1
        rows[k].append(i)
        room[k] -= n
    while len(rows) % multiple:
        fullest = max(range(len(rows)), key=lambda r: len(rows[r]))
        moved = rows[fullest].pop()
        room[fullest] += len(samples[moved].ids)
        rows.append([moved])
        room.append(max_tokens - len(samples[moved].ids))
    return rows


def collate(samples: list[Sample], rows: list[list[int]]) -> Packed:
    """The tensors of packed ``rows`` (``pack``'s), right-padded to the longest row."""
    T = max(sum(len(samples[i].ids) for i in row) for row in rows)
    shape = (len(rows), T)
    ids, pos, seg, mask = (torch.zeros(shape, dtype=torch.long), torch.zeros(shape, dtype=torch.long),
                           torch.full(shape, -1, dtype=torch.long), torch.zeros(shape))
    for r, row in enumerate(rows):
        at = 0
        for k, i in enumerate(row):
            s, n = samples[i], len(samples[i].ids)
            ids[r, at:at + n] = torch.tensor(s.ids)
            pos[r, at:at + n] = torch.arange(n)
            seg[r, at:at + n] = k
            mask[r, at:at + n] = torch.tensor(s.mask, dtype=torch.float)
            at += n
    return Packed(ids, pos, seg, mask)
