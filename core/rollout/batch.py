"""What every rollout engine returns (embedded and vLLM alike): the generate() Batch -- prompts left-padded,
responses right-padded, masks, positions and the sampled tokens' log-probs -- and the tokenizer helpers both use.

Keys: ``prompts`` (B, Tp), ``responses`` (B, Tr), ``response_mask`` (B, Tr), ``rollout_logprobs`` (B, Tr),
``input_ids`` and ``attention_mask`` (B, Tp + Tr), ``position_ids`` (B, Tp + Tr) counting valid tokens.

A multi-turn (agent) response holds tool-output and chat-template tokens between the model's turns: real tokens,
attended and positioned like any other (``attention_mask`` 1), but not the model's samples (``response_mask`` 0,
log-prob 0). So the response part of ``attention_mask`` is the response's *real* tokens, and ``response_mask`` the
model's among them -- equal for a single-turn response.
"""

from __future__ import annotations

import torch

from core.protocol import Batch


def assemble(prompts: list[list[int]], tokens: list[list[int]], logps: list[list[float]], n: int, pad: int,
             sampled: list[list[float]] | None = None) -> Batch:
    """The generate() Batch of finished samples: ``tokens[b]`` / ``logps[b]`` are sample b's response and its
    tokens' log-probs, samples b = i * n ... i * n + n - 1 those of ``prompts[i]``. Prompts are left-padded and
    responses right-padded to the longest of each (any engine's output goes through here). ``sampled[b]``: 1 on
    the model's tokens, 0 on tool-output / template tokens (a multi-turn response); default all 1."""
    Tp = max(map(len, prompts))
    Tr = max(map(len, tokens))
    B = len(tokens)
    if B != len(prompts) * n or len(logps) != B:
        raise ValueError(f"{len(prompts)} prompts x n={n} need {len(prompts) * n} samples, got {B} token lists and "
                         f"{len(logps)} log-prob lists")
    out_prompts = torch.full((B, Tp), pad, dtype=torch.long)
    prompt_mask = torch.zeros(B, Tp, dtype=torch.long)
    responses = torch.full((B, Tr), pad, dtype=torch.long)
    mask = torch.zeros(B, Tr)
    out_logps = torch.zeros(B, Tr)
    for b in range(B):
        p, r = prompts[b // n], tokens[b]
        if len(logps[b]) != len(r):
            raise ValueError(f"sample {b}: {len(r)} tokens but {len(logps[b])} log-probs")
        out_prompts[b, Tp - len(p):] = torch.tensor(p)
        prompt_mask[b, Tp - len(p):] = 1
        responses[b, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[b, :len(r)] = 1.0
        out_logps[b, :len(r)] = torch.tensor(logps[b])
    if sampled is None:
        return _assemble(out_prompts, prompt_mask, responses, mask, out_logps)
    model = torch.zeros(B, Tr)
    for b, m in enumerate(sampled):
        if len(m) != len(tokens[b]):
            raise ValueError(f"sample {b}: {len(tokens[b])} tokens but {len(m)} sampled-mask entries")
        model[b, :len(m)] = torch.tensor(m, dtype=torch.float32)
    return _assemble(out_prompts, prompt_mask, responses, model, out_logps * model, mask)


def decode_responses(tokenizer, batch: Batch, whole: bool = False) -> list[str]:
    """Response texts of a generated batch: the model's tokens, special tokens dropped (what rewards read); or
    ``whole``: every real response token, tool answers and chat-template markers included (for people to read)."""
    if whole:
        real = batch["attention_mask"][:, batch["prompts"].shape[1]:]
        return tokenizer.batch_decode([r[m > 0] for r, m in zip(batch["responses"], real)])
    return tokenizer.batch_decode([r[m > 0] for r, m in zip(batch["responses"], batch["response_mask"])],
                                  skip_special_tokens=True)


def _assemble(prompts, prompt_mask, responses, response_mask, logps, response_real=None) -> Batch:
    """``response_real``: the response's real tokens (attended); default ``response_mask`` (a single turn)."""
    real = response_mask if response_real is None else response_real
    attention = torch.cat([prompt_mask, (real > 0).long()], dim=1)
    position = (attention.cumsum(-1) - 1).clamp(min=0)
    return Batch({"prompts": prompts, "responses": responses, "response_mask": response_mask,
                  "rollout_logprobs": logps, "input_ids": torch.cat([prompts, responses], 1),
                  "attention_mask": attention, "position_ids": position})


def merge_padded(parts: list[Batch], pad_id: int, prompt_width: int | None = None,
                 response_width: int | None = None) -> Batch:
    """Concatenate generated chunks, padding prompts on the left and responses on the right to common widths
    (the widest part, or the given widths -- fixed widths make outputs of different ranks concatenable). Other
    per-sample (B,) tensors every part has are concatenated too, and per-token (B, Tr) ones padded with 0."""
    Tp = max(p["prompts"].shape[1] for p in parts)
    Tr = max(p["responses"].shape[1] for p in parts)
    if prompt_width is not None:
        if Tp > prompt_width:
            raise ValueError(f"a prompt has {Tp} tokens, more than max_prompt_length={prompt_width}")
        Tp = prompt_width
    Tr = response_width if response_width is not None else Tr
    reals = [p["attention_mask"][:, p["prompts"].shape[1]:] for p in parts]  # each part's real response tokens
    longest = max(int(r.sum(-1).amax()) if len(r) else 0 for r in reals)
    if longest > Tr:  # padding to a narrower width would crop real tokens
        raise ValueError(f"a response has {longest} tokens, more than the batch's response width {Tr}")

    def left(x, width, value):
        return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

    def right(x, width, value):
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    prompts = torch.cat([left(p["prompts"], Tp, pad_id) for p in parts])
    pmask = torch.cat([left(p["attention_mask"][:, :p["prompts"].shape[1]], Tp, 0) for p in parts])
    responses = torch.cat([right(p["responses"], Tr, pad_id) for p in parts])
    rmask = torch.cat([right(p["response_mask"], Tr, 0.0) for p in parts])
    real = torch.cat([right(r, Tr, 0) for r in reals])
    logps = torch.cat([right(p["rollout_logprobs"], Tr, 0.0) for p in parts])
    out = _assemble(prompts, pmask, responses, rmask, logps, real)
    for key in parts[0].tensors:  # per-sample extras (an agent's num_turns, ...) and per-token ones come along
        if key in out.tensors or not all(key in p.tensors for p in parts):
            continue
        if parts[0][key].dim() == 1:
            out[key] = torch.cat([p[key] for p in parts])
        elif all(p[key].shape == p["responses"].shape for p in parts):  # (B, Tr): padded like the responses
            out[key] = torch.cat([right(p[key], Tr, 0.0) for p in parts])
    return out
