"""Batch filters and reward shaping: DAPO dynamic sampling, DAPO overlong penalty, PF-PPO resampling."""

from __future__ import annotations

import torch

from core.algos.ops import group_ids, group_stats
from core.protocol import Batch


def groups_with_variance(uid, metric: torch.Tensor) -> torch.Tensor:
    """DAPO dynamic sampling: a (B,) bool mask keeping the rows of groups whose metric varies (std > 0).

    Groups where every sample scored the same give GRPO zero advantage, so they only dilute the batch. A group
    of one is kept (verl keeps it: its std is undefined, not zero).
    Paper: DAPO, Yu et al. 2025 (arXiv:2503.14476), Sec. 3.2.
    Example: uid [a, a, b, b], acc [1, 0, 1, 1] -> keep [True, True, False, False].
    """
    _, std, n = group_stats(metric.double(), group_ids(uid))
    return (std > 0) | (n == 1)


def overlong_penalty(response_lengths: torch.Tensor, max_len: int, buffer: int, penalty: float) -> torch.Tensor:
    """DAPO soft overlong punishment, added to the reward (<= 0).

    r = clamp(-(len - (max_len - buffer)) / buffer * penalty, -penalty, 0): zero up to max_len - buffer, linear
    over the last ``buffer`` tokens, -penalty at max_len. Paper: DAPO (arXiv:2503.14476), Eq. 13.
    Example: max_len 20, buffer 4, penalty 1: lengths [16, 18, 20] -> [0, -0.5, -1].
    """
    exceed = response_lengths.to(torch.float32) - (max_len - buffer)
    return (-exceed / buffer * penalty).clamp(-penalty, 0.0)


def pf_ppo_resample(batch: Batch, method: str = "pow", weight_pow: float = 2.0,
                    generator: torch.Generator | None = None) -> Batch:
    """PF-PPO policy filtration: resample the batch (with replacement, same size) by a weight of each score.

    weights: ``pow`` |R|^p;  ``max_min`` 1 for the batch's max and min scores, else 0;  ``max_random`` 0.4 for the
    max score, 0.1 otherwise; then + 1e-8. Key: ``scores`` (B,).
    Paper: Shen et al. 2024, "Policy Filtration in RLHF to Fine-Tune LLM for Code Generation" (arXiv:2409.06957).
    Example (max_min): scores [0, 0.5, 1] -> weights [1, 0, 1]: the 0.5 sample is (almost) never drawn.
    """
    return batch.index(pf_ppo_rows(batch, method, weight_pow, generator))


def pf_ppo_rows(batch: Batch, method: str = "pow", weight_pow: float = 2.0,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """The row indices ``pf_ppo_resample`` draws (B,), with replacement."""
    batch.require("scores")
    s = batch["scores"].double()
    if method == "pow":
        w = s.abs().pow(weight_pow)
    elif method == "max_min":
        w = ((s == s.max()) | (s == s.min())).double()
    elif method == "max_random":
        w = torch.where(s == s.max(), 0.4, 0.1).double()
    else:
        raise ValueError(f"PF-PPO method must be pow, max_min or max_random, got {method!r}")
    return torch.multinomial(w + 1e-8, len(s), replacement=True, generator=generator)
