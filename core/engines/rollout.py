"""The embedded rollout engine: runs a transformers causal LM's own modules with a KV cache, batched.

``generate(prompt_ids, params)`` returns one ``Batch`` (vocabulary in ``core.protocol``) with, for each of the
``n`` samples of every prompt (interleaved: the n samples of a prompt are adjacent, sharing a ``uid``):

    prompts (B, Tp) left-padded | responses (B, Tr) right-padded | response_mask (B, Tr) | rollout_logprobs (B, Tr)
    input_ids, attention_mask, position_ids (B, Tp + Tr)

``rollout_logprobs`` are the sampled tokens' log-probs under ``logits / temperature`` (raw logits when greedy),
the same distribution the trainer recomputes, so the two can be compared token by token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from core.protocol import Batch


@dataclass(frozen=True)
class SamplingParams:
    # samples per prompt
    n: int = 1
    # 0 = greedy
    temperature: float = 1.0
    # nucleus sampling mass (1 = off)
    top_p: float = 1.0
    # keep the k most likely tokens (0 or -1 = off)
    top_k: int = -1
    # response length limit in tokens
    max_new_tokens: int = 256
    # extra strings that end a response (EOS always does)
    stop: tuple[str, ...] = ()
    # seed of the sampling generator
    seed: int = 0


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k / top-p (nucleus) set to -inf. logits: (B, V)."""
    if top_k and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=True, dim=-1)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > top_p  # keep the smallest prefix whose mass reaches top_p
        logits = logits.masked_fill(drop.scatter(-1, idx, drop), float("-inf"))
    return logits


class RolloutEngine:
    """Generation with a transformers model in this process (colocated with the trainer or standalone)."""

    def __init__(self, model, tokenizer, max_batch_size: int = 64):
        self.model, self.tokenizer, self.max_batch_size = model.eval(), tokenizer, max_batch_size
        self.eos_ids = self._eos_ids()
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]

    def _eos_ids(self) -> list[int]:
        ids = self.model.generation_config.eos_token_id if self.model.generation_config else None
        ids = ids if isinstance(ids, list) else [ids] if ids is not None else []
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return sorted(set(ids))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ----------------------------------------------------------------------------------------- weights
    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy full tensors into the engine's parameters by name (a bucket at a time); returns bytes copied."""
        params = dict(self.model.named_parameters())
        copied = 0
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"rollout engine has no parameter {name!r}")
            if params[name].shape != tensor.shape:
                raise ValueError(f"weight {name}: engine shape {tuple(params[name].shape)} != sent {tuple(tensor.shape)}")
            params[name].copy_(tensor)
            copied += tensor.numel() * tensor.element_size()
        return copied

    # ----------------------------------------------------------------------------------------- generation
    def decode(self, batch: Batch) -> list[str]:
        """Response texts of a generated batch (valid tokens only, special tokens dropped)."""
        return self.tokenizer.batch_decode([r[m > 0] for r, m in zip(batch["responses"], batch["response_mask"])],
                                           skip_special_tokens=True)

    def chat_prompt_ids(self, prompts: Sequence[list[dict]]) -> list[list[int]]:
        """Token ids of chat prompts with the generation prompt appended (the model's chat template)."""
        return [self.tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False)
                for p in prompts]

    @torch.no_grad()
    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> Batch:
        rows = [list(p) for p in prompt_ids for _ in range(params.n)]
        gen = torch.Generator().manual_seed(params.seed)
        parts = [self._generate_chunk(rows[i:i + self.max_batch_size], params, gen)
                 for i in range(0, len(rows), self.max_batch_size)]
        return merge_padded(parts, self.pad_id)

    def _generate_chunk(self, rows: list[list[int]], params: SamplingParams, gen: torch.Generator) -> Batch:
        B, Tp = len(rows), max(len(r) for r in rows)
        dev = self.device
        prompts = torch.full((B, Tp), self.pad_id, dtype=torch.long)
        prompt_mask = torch.zeros(B, Tp, dtype=torch.long)
        for i, r in enumerate(rows):
            prompts[i, Tp - len(r):] = torch.tensor(r)
            prompt_mask[i, Tp - len(r):] = 1
        attn = prompt_mask.to(dev)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        eos = torch.tensor(self.eos_ids, device=dev)
        out_tokens, out_logps = [], []
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        cache, step_ids, step_pos = None, prompts.to(dev), pos
        for _ in range(params.max_new_tokens):
            out = self.model(input_ids=step_ids, attention_mask=attn, position_ids=step_pos,
                             past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits = out.logits[:, -1].float()
            if params.temperature > 0:
                logits = logits / params.temperature
            logp_all = logits.log_softmax(-1)
            if params.temperature > 0:
                probs = filter_logits(logits, params.top_k, params.top_p).softmax(-1)
                tok = torch.multinomial(probs.cpu(), 1, generator=gen).squeeze(-1).to(dev)
            else:
                tok = logits.argmax(-1)
            tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
            out_tokens.append(tok)
            out_logps.append(torch.where(done, 0.0, logp_all.gather(-1, tok[:, None]).squeeze(-1)))
            done = done | torch.isin(tok, eos)
            if params.stop:
                done = done | self._hit_stop(out_tokens, params.stop)
            if bool(done.all()):
                break
            step_ids, step_pos = tok[:, None], step_pos[:, -1:] + 1
            attn = torch.cat([attn, torch.ones(B, 1, dtype=attn.dtype, device=dev)], dim=1)
        responses = torch.stack(out_tokens, 1).cpu()
        logps = torch.stack(out_logps, 1).cpu()
        mask = _response_mask(responses, torch.tensor(self.eos_ids), self.pad_id)
        responses = responses.masked_fill(mask == 0, self.pad_id)
        return _assemble(prompts, prompt_mask, responses, mask, logps * mask)

    def _hit_stop(self, out_tokens: list[torch.Tensor], stop: tuple[str, ...]) -> torch.Tensor:
        tail = torch.stack(out_tokens[-16:], 1).cpu()
        texts = self.tokenizer.batch_decode(tail, skip_special_tokens=True)
        return torch.tensor([any(s in t for s in stop) for t in texts], device=self.device)


def _response_mask(responses: torch.Tensor, eos: torch.Tensor, pad_id: int) -> torch.Tensor:
    """1 up to and including the first EOS of each row, 0 after it (pad written after a stop string too)."""
    is_eos = torch.isin(responses, eos)
    after_eos = (is_eos.cumsum(-1) - is_eos.long()) > 0
    return (~after_eos).float()


def _assemble(prompts, prompt_mask, responses, response_mask, logps) -> Batch:
    attention = torch.cat([prompt_mask, response_mask.long()], dim=1)
    position = (attention.cumsum(-1) - 1).clamp(min=0)
    return Batch({"prompts": prompts, "responses": responses, "response_mask": response_mask,
                  "rollout_logprobs": logps, "input_ids": torch.cat([prompts, responses], 1),
                  "attention_mask": attention, "position_ids": position})


def merge_padded(parts: list[Batch], pad_id: int, prompt_width: int | None = None,
                 response_width: int | None = None) -> Batch:
    """Concatenate generated chunks, padding prompts on the left and responses on the right to common widths
    (the widest part, or the given widths -- fixed widths make outputs of different ranks concatenable)."""
    Tp = max(p["prompts"].shape[1] for p in parts)
    Tr = max(p["responses"].shape[1] for p in parts)
    if prompt_width is not None:
        if Tp > prompt_width:
            raise ValueError(f"a prompt has {Tp} tokens, more than max_prompt_length={prompt_width}")
        Tp = prompt_width
    Tr = response_width if response_width is not None else Tr

    def left(x, width, value):
        return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

    def right(x, width, value):
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    prompts = torch.cat([left(p["prompts"], Tp, pad_id) for p in parts])
    pmask = torch.cat([left(p["attention_mask"][:, :p["prompts"].shape[1]], Tp, 0) for p in parts])
    responses = torch.cat([right(p["responses"], Tr, pad_id) for p in parts])
    rmask = torch.cat([right(p["response_mask"], Tr, 0.0) for p in parts])
    logps = torch.cat([right(p["rollout_logprobs"], Tr, 0.0) for p in parts])
    return _assemble(prompts, pmask, responses, rmask, logps)
