"""Teacher-forced forward over (prompt + response): the response tokens' log-probs and entropy."""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from core.train.lm_head import fused_head, head_logprobs
from core.train.shared_prompt import prompt_groups, shared_prompt_logits, shared_prompt_logprobs
from core.data.vision_inputs import collate, mrope_positions
from core.models import keeps_logits
from core.protocol import Batch


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


# fp32 logits normalised at once: 2^28 values (1 GiB) bound that memory peak whatever the vocabulary and length
CHUNK_VALUES = 1 << 28


def _normalise(logits: torch.Tensor, ids: torch.Tensor, temperature: float, with_entropy: bool):
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    logz = torch.logsumexp(x, dim=-1)
    logp = x.gather(-1, ids[..., None]).squeeze(-1) - logz
    if not with_entropy:
        return logp
    return logp, logz - (x.softmax(-1) * x).sum(-1)


def normalised_logprobs(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False,
                        chunk_values: int = CHUNK_VALUES) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(logits / T)[ids] (B, Tr) and the entropy, from the model's (B, Tr, V) logits in its dtype.

    Done at once, the fp32 copy, the logsumexp's exp and, in backward, the softmax and the gradient each take
    4 B T V bytes: 14 B T V at the peak with the bf16 logits, 48 GB for one 22k-token sequence of a 152k
    vocabulary. Response positions beyond ``chunk_values / (B V)`` go in chunks, each under activation
    checkpointing: backward recomputes a chunk's fp32 values, so what stays is the bf16 logits and their bf16
    gradient (about 6 B T V with the chunk gradients and their concatenation) plus one chunk's fp32 work.
    Positions are independent, so the values and gradients are the same as at once (tests/train/test_forward.py)."""
    B, Tr, V = logits.shape
    cols = max(1, chunk_values // (V * B))        # response positions per chunk
    if Tr <= cols:
        out = _normalise(logits, ids, temperature, with_entropy)
        return out if with_entropy else (out, None)
    # torch.split (views of the strided logits, no copy), not slicing: split's backward concatenates the chunk
    # gradients once, where each slice's backward would build a zero-filled gradient of the whole tensor
    grad = torch.is_grad_enabled() and logits.requires_grad
    outs = [checkpoint(_normalise, x, i, temperature, with_entropy, use_reentrant=False) if grad
            else _normalise(x, i, temperature, with_entropy)
            for x, i in zip(torch.split(logits, cols, dim=1), torch.split(ids, cols, dim=1))]
    if not with_entropy:
        return torch.cat(outs, dim=1), None
    return torch.cat([o[0] for o in outs], dim=1), torch.cat([o[1] for o in outs], dim=1)


def response_logprobs(model, batch: Batch, temperature: float = 1.0, with_entropy: bool = False,
                      remove_padding: bool = True, share_prompt: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(response_t | context) under ``logits / temperature`` (B, Tr), and the per-token entropy (B, Tr).

    Keys: input_ids, attention_mask, position_ids, responses; with image prompts ``multi_modal_inputs`` (each
    row's vision inputs, ``core.data.vision_inputs``), given to the model with the rows (and, for M-RoPE
    models, the position ids they imply in place of ``position_ids``). The logits at position
    Tp-1+t predict response token t, so only the response span goes through the LM head where the model allows it
    (``logits_to_keep``: the vocabulary projection of the prompt positions is skipped) and is normalised (the
    softmax is the memory peak).
    ``remove_padding``: run the model on ``trim_padding(batch)`` and pad the results back to (B, Tr) with zeros.
    ``share_prompt``: rows with the same prompt run as one packed row, the prompt encoded once
    (``core.train.shared_prompt``; where the model takes a custom 4D mask and a ``logits_to_keep`` index)."""
    batch.require("input_ids", "attention_mask", "position_ids", "responses")
    full = batch["responses"].shape[1]
    device = batch["input_ids"].device
    vision = ({k: v.to(device) for k, v in collate(list(batch["multi_modal_inputs"])).items()}
              if "multi_modal_inputs" in batch else {})
    if remove_padding:
        batch = trim_padding(batch)
    Tr = batch["responses"].shape[1]
    mrope = mrope_positions(model, batch["input_ids"], batch["attention_mask"], vision) if vision else None
    positions = batch["position_ids"] if mrope is None else mrope[0]
    # image prompts: every row runs with its own images (the packed shared-prompt layout does not carry them yet)
    groups = prompt_groups(batch) if share_prompt and keeps_logits(model) and not vision else None
    head = fused_head(model) if keeps_logits(model) else None
    if groups is not None and len(groups) < len(batch):
        if head is not None:
            logp, entropy = shared_prompt_logprobs(model, batch, groups, head, temperature, with_entropy)
        else:
            logp, entropy = normalised_logprobs(shared_prompt_logits(model, batch, groups), batch["responses"],
                                                temperature, with_entropy)
    elif head is not None:
        logp, entropy = _fused_logprobs(model, head, batch, positions, temperature, with_entropy, vision)
    else:
        keep = {"logits_to_keep": Tr + 1} if keeps_logits(model) else {}
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=positions, use_cache=False, **keep, **vision).logits[:, -Tr - 1:-1]
        logp, entropy = normalised_logprobs(logits, batch["responses"], temperature, with_entropy)
    if Tr < full:  # trimmed response columns are padding: zero log-prob and entropy there
        logp = F.pad(logp, (0, full - Tr))
        entropy = F.pad(entropy, (0, full - Tr)) if entropy is not None else None
    return logp, entropy


def _fused_logprobs(model, head, batch: Batch, positions: torch.Tensor, temperature: float, with_entropy: bool,
                    vision: dict):
    """The standard layout with the LM head fused into the log-softmax (``core.train.lm_head``): the Tr positions
    before each row's last one predict its Tr response tokens. ``positions``: (B, T), or M-RoPE's (3, B, T);
    ``vision``: the rows' collated vision inputs."""
    (B, T), Tr = batch["input_ids"].shape, batch["responses"].shape[1]
    device = batch["input_ids"].device
    pos = torch.arange(B * Tr, device=device)                      # row b, response token t: kept position b Tr + t
    with head_logprobs(head, pos, batch["responses"].reshape(-1).to(device), temperature, with_entropy):
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    position_ids=positions, use_cache=False,
                    logits_to_keep=torch.arange(T - Tr - 1, T - 1, device=device), **vision).logits.view(B, Tr, 2)
    return out[..., 0], out[..., 1] if with_entropy else None
