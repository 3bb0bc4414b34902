"""Teacher-forced forward over (prompt + response): the response tokens' log-probs and entropy."""

from __future__ import annotations

import torch

from core.protocol import Batch


def response_logprobs(model, batch: Batch, temperature: float = 1.0, with_entropy: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(response_t | context) under ``logits / temperature`` (B, Tr), and the per-token entropy (B, Tr).

    Keys: input_ids, attention_mask, position_ids, responses. The logits at position Tp-1+t predict response
    token t, so only the response span is normalised (the vocabulary softmax is the memory peak)."""
    batch.require("input_ids", "attention_mask", "position_ids", "responses")
    Tr = batch["responses"].shape[1]
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"], use_cache=False)
    logits = out.logits[:, -Tr - 1:-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    logz = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, batch["responses"][..., None]).squeeze(-1) - logz
    entropy = None
    if with_entropy:
        entropy = logz - (logits.softmax(-1) * logits).sum(-1)
    return logp, entropy
