"""How a role's rows become passes: micro-batches by rows or by a token budget, length order and its inverse, and the
data-parallel agreements around them (every rank runs as many passes; the loss normalisers summed over the ranks;
the epoch reshuffles' seed). Shared by the policy, the critic and the reward model, whatever engine holds them."""

from __future__ import annotations

import torch
import torch.distributed as dist

from core.protocol import Batch


def micro_batches(batch: Batch, size: int, max_tokens: int) -> list[Batch]:
    """Consecutive micro-batches: ``size`` rows each, or as many rows as fit ``max_tokens``, counted as rows x the
    width the group runs at once its padding is removed (its longest prompt + its longest response)."""
    if max_tokens <= 0:
        return batch.split(size)
    Tp = batch["input_ids"].shape[1] - batch["responses"].shape[1]
    prompt = batch["attention_mask"][:, :Tp].sum(-1).tolist()
    response = batch["attention_mask"][:, Tp:].sum(-1).tolist()
    groups, start, p_max, r_max = [], 0, 0, 0
    for i, (p, r) in enumerate(zip(prompt, response)):
        if i > start and (max(p_max, p) + max(r_max, r)) * (i - start + 1) > max_tokens:
            groups.append(batch.index(slice(start, i)))
            start, p_max, r_max = i, 0, 0
        p_max, r_max = max(p_max, p), max(r_max, r)
    groups.append(batch.index(slice(start, len(batch))))
    return groups


def length_order(batch: Batch) -> torch.Tensor:
    """Row order by real length (stable): with a token budget, groups of similar widths then fill it instead
    of every group running at the width of the one long row it happens to hold."""
    return torch.argsort(batch["attention_mask"].sum(-1), stable=True)


def restore_order(rows: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Rows computed in ``order`` (``length_order``) back in the caller's row order."""
    return torch.empty_like(rows).index_copy_(0, order, rows)


def global_counts(mask: torch.Tensor, device: torch.device) -> tuple[float, float]:
    """Valid tokens and sequences of a mini-batch summed over the DP ranks (the loss normalisers)."""
    t = torch.tensor([float(mask.sum()), float(mask.shape[0])], device=device)
    dist.all_reduce(t)
    return float(t[0]), float(t[1])


def reshuffle_seed(ppo_epochs: int) -> int:
    """The seed of one update's epoch reshuffles (epochs after the first): drawn from this process's torch RNG,
    which is seeded at start and saved in checkpoints, so every update shuffles anew and a resumed run alike
    (``cfg.seed + epoch`` gave the same permutations at every step). 0, drawing nothing, with a single epoch."""
    return int(torch.randint(0, 2**31, ())) if ppo_epochs > 1 else 0


def equalise_passes(micros: list, device: torch.device) -> list:
    """Pad this rank's micro-batches with None up to the most any rank has: every rank must run as many
    forward/backward passes as the others (FSDP collectives inside)."""
    n = torch.tensor([len(micros)], device=device)
    dist.all_reduce(n, op=dist.ReduceOp.MAX)
    return micros + [None] * (int(n) - len(micros))
