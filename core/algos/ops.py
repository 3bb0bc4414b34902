"""Masked and per-group reductions shared by the estimators and losses. All vectorised: no loop over samples."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(x * mask) / sum(mask); an all-zero mask gives 0 (not NaN)."""
    return masked_sum(x, mask, dim) / (mask.sum() if dim is None else mask.sum(dim)).clamp(min=1e-8)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over the masked entries; unbiased (Bessel n/(n-1)) as verl's ``masked_var``."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = mask.sum()
        if n <= 1:
            raise ValueError(f"unbiased masked variance needs at least 2 valid entries, got {int(n)}")
        var = var * n / (n - 1)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(x - mean) / sqrt(var + 1e-8) over the masked entries (unbiased var); ``shift_mean=False`` adds mean back."""
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + 1e-8)
    return out if shift_mean else out + mean


def group_ids(uid: Sequence | np.ndarray | torch.Tensor) -> torch.Tensor:
    """Dense group index (B,) long from the ``uid`` column: rows with equal uid share an index."""
    if isinstance(uid, torch.Tensor):
        return torch.unique(uid, return_inverse=True)[1]
    return torch.from_numpy(np.unique(np.asarray(uid, dtype=object).astype(str), return_inverse=True)[1]).long()


def group_stats(x: torch.Tensor, gid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (mean, unbiased std, size) of the row's group. x: (B,) float, gid: (B,) long.

    Groups of one get mean 0 and std 1 (verl's convention, so a lone sample keeps its raw score)."""
    n_groups = int(gid.max()) + 1 if gid.numel() else 0
    count = torch.zeros(n_groups, dtype=x.dtype).index_add_(0, gid, torch.ones_like(x))
    mean = torch.zeros(n_groups, dtype=x.dtype).index_add_(0, gid, x) / count
    sq = torch.zeros(n_groups, dtype=x.dtype).index_add_(0, gid, (x - mean[gid]) ** 2)
    std = (sq / (count - 1).clamp(min=1)).sqrt()
    lone = count == 1
    mean, std = mean.masked_fill(lone, 0.0), std.masked_fill(lone, 1.0)
    return mean[gid], std[gid], count[gid]


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last valid token per row (B,) long; rows with no valid token give 0."""
    t = torch.arange(mask.shape[-1], device=mask.device)
    return (t * (mask > 0)).amax(-1)


def scores_to_token_rewards(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) outcome scores -> (B, T) token rewards with the score at each row's last valid token."""
    out = torch.zeros_like(response_mask, dtype=scores.dtype)
    out[torch.arange(len(scores)), last_token_index(response_mask)] = scores
    return out * (response_mask > 0)
