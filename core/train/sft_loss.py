"""The SFT loss of a packed batch (``core.sft.packing``) on the training engines' model.

The loss is the mean negative log-likelihood of the trained tokens (mask 1) over the whole batch -- every trained
token weighs the same, wherever it was packed -- returned as (sum, count) so that data-parallel ranks and gradient
accumulation divide by the global count (``PolicyWorker.sft_update``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from core.sft.packing import Packed


def token_nll(model, batch: Packed) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the trained tokens' negative log-likelihood, their count): each token predicted from the tokens
    before it in its own sample; a sample's first token is never a target (nothing of its sample precedes it).
    Where the model allows it the LM head runs on the trained positions only, fused into the log-softmax
    (``core.train.lm_head``): an SFT row trains a fraction of its tokens, and the full (rows x T x vocabulary)
    logits would be most of the memory."""
    from core.models import keeps_logits
    from core.train.lm_head import fused_head, head_logprobs

    weight = batch.loss_mask[:, 1:] * (batch.segment[:, 1:] == batch.segment[:, :-1])        # (R, T - 1)
    inputs = dict(input_ids=batch.input_ids, position_ids=batch.position_ids,
                  attention_mask=batch.attention_mask().to(batch.input_ids.device), use_cache=False)
    head = fused_head(model) if keeps_logits(model) else None
    if head is not None:
        R, T = batch.input_ids.shape
        rows, cols = (weight > 0).nonzero(as_tuple=True)                  # position (r, c) predicts token c + 1
        with head_logprobs(head, rows * T + cols, batch.input_ids[rows, cols + 1], 1.0, False):
            logp = model(**inputs).logits[:, 0]
        return -(logp * weight[rows, cols]).sum(), weight.sum()
    logits = model(**inputs).logits[:, :-1].float()
    targets = batch.input_ids[:, 1:]
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    return (nll * weight.reshape(-1)).sum(), weight.sum()
