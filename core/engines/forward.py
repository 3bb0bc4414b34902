"""Teacher-forced forward over (prompt + response): the response tokens' log-probs and entropy."""

from __future__ import annotations

import inspect

import torch

from core.protocol import Batch


def _keeps_logits(model) -> bool:
    fwd = getattr(model, "forward", None)
    return fwd is not None and "logits_to_keep" in inspect.signature(fwd).parameters


def response_logprobs(model, batch: Batch, temperature: float = 1.0, with_entropy: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(response_t | context) under ``logits / temperature`` (B, Tr), and the per-token entropy (B, Tr).

    Keys: input_ids, attention_mask, position_ids, responses. The logits at position Tp-1+t predict response
    token t, so only the response span goes through the LM head where the model allows it (``logits_to_keep``:
    the vocabulary projection of the prompt positions is skipped) and is normalised (the softmax is the memory peak)."""
    batch.require("input_ids", "attention_mask", "position_ids", "responses")
    Tr = batch["responses"].shape[1]
    keep = {"logits_to_keep": Tr + 1} if _keeps_logits(model) else {}
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"], use_cache=False, **keep)
    logits = out.logits[:, -Tr - 1:-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    logz = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, batch["responses"][..., None]).squeeze(-1) - logz
    entropy = None
    if with_entropy:
        entropy = logz - (logits.softmax(-1) * logits).sum(-1)
    return logp, entropy
