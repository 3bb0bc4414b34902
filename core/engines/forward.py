"""Teacher-forced forward over (prompt + response): the response tokens' log-probs and entropy."""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from core.protocol import Batch


def keeps_logits(model) -> bool:
    """Does the model's forward take ``logits_to_keep`` (project only the last positions onto the vocabulary)?"""
    fwd = getattr(model, "forward", None)
    return fwd is not None and "logits_to_keep" in inspect.signature(fwd).parameters


def trim_padding(batch: Batch) -> Batch:
    """The batch without the columns that are padding in every row: left of the earliest prompt token and right
    of the latest response token (prompts are left-padded, responses right-padded). Positions are explicit
    (``position_ids``), so dropping columns changes no token's position or what it attends to."""
    Tr = batch["responses"].shape[1]
    used = batch["attention_mask"].bool().any(0)                              # (T,)
    Tp = used.shape[0] - Tr
    left = int(used[:Tp].long().argmax()) if bool(used[:Tp].any()) else 0
    answered = used[Tp:].nonzero()
    keep = int(answered[-1]) + 1 if len(answered) else 1                       # response columns kept
    cols = slice(left, Tp + keep)
    return Batch({"input_ids": batch["input_ids"][:, cols], "attention_mask": batch["attention_mask"][:, cols],
                  "position_ids": batch["position_ids"][:, cols], "responses": batch["responses"][:, :keep]})


def response_logprobs(model, batch: Batch, temperature: float = 1.0, with_entropy: bool = False,
                      remove_padding: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(response_t | context) under ``logits / temperature`` (B, Tr), and the per-token entropy (B, Tr).

    Keys: input_ids, attention_mask, position_ids, responses. The logits at position Tp-1+t predict response
    token t, so only the response span goes through the LM head where the model allows it (``logits_to_keep``:
    the vocabulary projection of the prompt positions is skipped) and is normalised (the softmax is the memory peak).
    ``remove_padding``: run the model on ``trim_padding(batch)`` and pad the results back to (B, Tr) with zeros."""
    batch.require("input_ids", "attention_mask", "position_ids", "responses")
    full = batch["responses"].shape[1]
    if remove_padding:
        batch = trim_padding(batch)
    Tr = batch["responses"].shape[1]
    keep = {"logits_to_keep": Tr + 1} if keeps_logits(model) else {}
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
    if Tr < full:  # trimmed response columns are padding: zero log-prob and entropy there
        logp = F.pad(logp, (0, full - Tr))
        entropy = F.pad(entropy, (0, full - Tr)) if entropy is not None else None
    return logp, entropy
