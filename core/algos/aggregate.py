"""Loss aggregation: a (B, T) per-token loss -> the scalar a micro-batch backpropagates.

Why global counts: a mini-batch is cut into micro-batches (gradient accumulation) and data-parallel ranks
(gradients averaged). Each micro-batch's loss is normalised by the token/sequence counts of the *whole*
mini-batch across all ranks and multiplied by ``dp_size`` (undoing the DP average), so that

    mean over ranks of (sum over that rank's micro-batches of loss)  ==  loss of the whole mini-batch,

and the same for the gradient -- whatever the split. Signature: ``agg(loss_mat, mask, norm) -> scalar``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from core.algos.registry import Registry

AggFn = Callable[[torch.Tensor, torch.Tensor, "LossNorm"], torch.Tensor]
AGGREGATIONS: Registry[AggFn] = Registry("loss aggregation", ("loss_mat", "mask", "norm"))


@dataclass(frozen=True)
class LossNorm:
    """The mini-batch-wide denominators one micro-batch's loss is normalised by.

    mode: an ``AGGREGATIONS`` name. global_tokens: valid response tokens in the whole mini-batch over all DP
    ranks. global_seqs: its sequences. dp_size: ranks whose gradients are averaged. norm_len: the constant
    length of ``seq-mean-token-sum-norm`` (Dr.GRPO's MAX_TOKENS; default the padded response length T)."""

    mode: str = "token-mean"
    global_tokens: float = 1.0
    global_seqs: float = 1.0
    dp_size: int = 1
    norm_len: float | None = None

    @staticmethod
    def of(mask: torch.Tensor, mode: str = "token-mean", dp_size: int = 1, norm_len: float | None = None) -> "LossNorm":
        """Denominators from the whole mini-batch's (B, T) response mask (already gathered over DP ranks)."""
        return LossNorm(mode, float(mask.sum()), float(mask.shape[0]), dp_size,
                        float(norm_len if norm_len is not None else mask.shape[-1]))


def aggregate(loss_mat: torch.Tensor, mask: torch.Tensor, norm: LossNorm) -> torch.Tensor:
    """Aggregate with ``norm.mode``."""
    return AGGREGATIONS[norm.mode](loss_mat, mask, norm)


def seq_mean(seq_losses: torch.Tensor, norm: LossNorm) -> torch.Tensor:
    """Mean of (B,) per-sequence losses over the mini-batch's sequences (for sequence-level objectives)."""
    return seq_losses.sum() / max(norm.global_seqs, 1.0) * norm.dp_size


@AGGREGATIONS.register("token-mean")
def token_mean(loss_mat, mask, norm):
    """Every valid token weighs the same (DAPO's token-level loss).

    L = sum_{i,t} m_it * l_it / N_tokens.   loss_mat, mask: (B, T); N_tokens over the whole mini-batch.
    Paper: DAPO, Yu et al. 2025 (arXiv:2503.14476), Sec. 3.3.
    Example: l = [[1, 2], [3, 0]], m = [[1, 1], [1, 0]] -> (1 + 2 + 3) / 3 = 2.0.
    """
    return (loss_mat * mask).sum() / max(norm.global_tokens, 1.0) * norm.dp_size


@AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(loss_mat, mask, norm):
    """Mean over tokens within each sequence, then mean over sequences (original GRPO).

    L = (1/N_seqs) sum_i [ sum_t m_it l_it / sum_t m_it ].   loss_mat, mask: (B, T).
    Paper: DeepSeekMath / GRPO, Shao et al. 2024 (arXiv:2402.03300), Eq. 3.
    Example: l = [[1, 2], [3, 0]], m = [[1, 1], [1, 0]] -> (1.5 + 3) / 2 = 2.25.
    """
    per_seq = (loss_mat * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return seq_mean(per_seq, norm)


@AGGREGATIONS.register("seq-mean-token-sum")
def seq_mean_token_sum(loss_mat, mask, norm):
    """Sum over tokens within each sequence, then mean over sequences.

    L = (1/N_seqs) sum_i sum_t m_it l_it.   loss_mat, mask: (B, T).
    Paper: the REINFORCE-style sequence objective (e.g. Ahmadian et al. 2024, arXiv:2402.14740).
    Example: l = [[1, 2], [3, 0]], m = [[1, 1], [1, 0]] -> (3 + 3) / 2 = 3.0.
    """
    return seq_mean((loss_mat * mask).sum(-1), norm)


@AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(loss_mat, mask, norm):
    """Sum over tokens, divided by a constant length, mean over sequences (Dr.GRPO: no length bias).

    L = (1/N_seqs) sum_i sum_t m_it l_it / L_norm, L_norm = ``norm.norm_len`` (default T).   (B, T).
    Paper: Dr.GRPO, Liu et al. 2025, "Understanding R1-Zero-Like Training" (arXiv:2503.20783).
    Example: l = [[1, 2], [3, 0]], m = [[1, 1], [1, 0]], L_norm = 2 -> ((3 + 3) / 2) / 2 = 1.5.
    """
    length = norm.norm_len if norm.norm_len is not None else loss_mat.shape[-1]
    return seq_mean((loss_mat * mask).sum(-1) / length, norm)
