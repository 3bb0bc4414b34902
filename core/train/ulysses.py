"""Ulysses sequence parallelism for the FSDP actor (``actor.ulysses_sp: N``; Jacobs et al. 2023, DeepSpeed-Ulysses,
arXiv:2309.14509): the N ranks of a group take the same rows, each 1/N of every row's positions, so each holds
1/N of the activations -- for sequences too long for one device.

- Slicing: a micro-batch without its all-padding columns (``forward.trim_padding``), padded on the right to a
  multiple of N columns; rank r of the group takes columns [r t, (r + 1) t). Positions are explicit
  (``position_ids``): rotary embeddings are the whole row's.
- Labels: the token a position predicts is read from the whole row *before* slicing (column c predicts column
  c + 1): a slice's last position predicts the next slice's first token. Shifting after slicing loses exactly
  those (verl#6068).
- Attention: around each attention call an all-to-all turns every rank's (rows, heads, t, D) into (rows,
  heads / N, N t, D) -- each rank attends for 1/N of the heads over the whole row -- and the inverse all-to-all
  turns the output back. KV heads are repeated to one per query head when N does not divide their number. The
  mask (causal, padding keys hidden) is built from the whole row's attention mask.
- Log-probs: each rank computes those of its own positions; a sum over the group whose backward is the identity
  gives every rank the whole (B, Tr) and its loss (each rank's loss is the group's: the gradient of a rank's part
  is the loss's gradient there, once).
- Gradients: a rank's backward reaches the computations of its own positions (and, through the all-to-all's
  backward, its keys' and values' use on the other ranks), so the sum over the group is the whole gradient. The
  loss is scaled by the DP size W / N (``core.algos.LossNorm``) while FSDP's reduce-scatter averages over all W
  ranks, so the gradients are multiplied by N before the optimizer step (``FSDPActor._step``; gloo has no
  pre-multiplied sum to make the reduction divide by W / N): the group's parts are summed, the DP ranks' averaged.

Exact up to summation order: sp = 2 gives sp = 1's log-probs, loss and gradients (tests/train/test_ulysses.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F

from core.train.forward import normalised_logprobs, trim_padding
from core.protocol import Batch


@dataclass
class SequenceParallel:
    """This rank's sequence-parallel group: its process group, size N and rank in it; in one forward's copy the
    whole rows' (B, 1, T, T) boolean mask (True = attend)."""

    group: object
    size: int
    rank: int
    mask: torch.Tensor | None = None

    def attention(self, module, attend, query, key, value) -> torch.Tensor:
        """query (B, H, t, D), key / value (B, KVH, t, D) of this rank's positions -> the attention output of those
        positions (B, t, H, Dv), every head having attended over the whole row. ``attend(module, q, k, v, mask)``:
        the attention of (B, h, T, D) queries and keys."""
        n, heads, kv_heads = self.size, query.shape[1], key.shape[1]
        if kv_heads % n:  # one KV head per query head, so that each rank's share of heads has its own
            key, value = (x.repeat_interleave(heads // kv_heads, dim=1) for x in (key, value))
            module = _Groups(module, 1)
        q, k, v = (heads_to_sequence(x, self.group, n) for x in (query, key, value))
        return sequence_to_heads(attend(module, q, k, v, self.mask), self.group, n)


def sequence_parallel(model: torch.nn.Module, ctx, size: int) -> SequenceParallel:
    """Collective: this rank's group of ``size`` consecutive ranks (every rank creates every group); the model's
    attention set to ours (it takes the all-to-alls)."""
    from core.train import train_attention

    world, heads = ctx.world_size, model.config.num_attention_heads
    if world % size or heads % size:
        raise ValueError(f"actor.ulysses_sp={size} must divide the actor's {world} ranks and the model's {heads} "
                         "attention heads")
    groups = [dist.new_group(list(range(g, g + size))) for g in range(0, world, size)]
    model.set_attn_implementation(train_attention.NAME)
    return SequenceParallel(groups[ctx.rank // size], size, ctx.rank % size)


class _Groups:
    """A module seen with another ``num_key_value_groups`` (SDPA's repeat of the KV heads reads it)."""

    def __init__(self, module, groups: int):
        self._module, self.num_key_value_groups = module, groups

    def __getattr__(self, name):
        return getattr(self._module, name)


class _AllToAll(torch.autograd.Function):
    """x (N, ...): chunk j goes to rank j of ``group``; returns (N, ...) whose chunk j came from rank j. Its
    backward is the same exchange of the gradients."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _exchange(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad, ctx.group), None


def _exchange(x: torch.Tensor, group) -> torch.Tensor:
    # contiguous first: empty_like keeps a permuted tensor's strides (a gradient often is one), while the exchange
    # reads and writes plain row-major chunks
    x = x.contiguous()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


class _SumOverGroup(torch.autograd.Function):
    """The sum of every rank's tensor (each rank's holds its positions, zeros elsewhere); backward: the identity --
    every rank computes the same loss from the sum, so the gradient of a rank's part is the loss's, once."""

    @staticmethod
    def forward(ctx, x, group):
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def heads_to_sequence(x: torch.Tensor, group, n: int) -> torch.Tensor:
    """(B, H, t, D) of this rank's positions -> (B, H / N, N t, D): head share r (this rank's) of every position."""
    B, H, t, D = x.shape
    chunks = x.reshape(B, n, H // n, t, D).transpose(0, 1)          # chunk j: head share j
    got = _AllToAll.apply(chunks.contiguous(), group)               # chunk j: rank j's positions, my heads
    return got.permute(1, 2, 0, 3, 4).reshape(B, H // n, n * t, D)


def sequence_to_heads(y: torch.Tensor, group, n: int) -> torch.Tensor:
    """(B, N t, H / N, D) attention output of my head share -> (B, t, H, D) of my positions, every head."""
    B, T, h, D = y.shape
    chunks = y.reshape(B, n, T // n, h, D).transpose(0, 1)          # chunk j: rank j's positions
    got = _AllToAll.apply(chunks.contiguous(), group)               # chunk j: my positions, head share j
    return got.permute(1, 2, 0, 3, 4).reshape(B, T // n, n * h, D)


def whole_row_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) 1 on real tokens -> (B, 1, T, T): causal, padding keys hidden; a position with no visible key (left
    padding) sees itself, so no softmax is over nothing (its output is never used)."""
    T = attention_mask.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=attention_mask.device).tril()
    eye = torch.eye(T, dtype=torch.bool, device=attention_mask.device)
    return ((causal & attention_mask.bool()[:, None, :]) | eye)[:, None]


def sp_logprobs(model, batch: Batch, sp: SequenceParallel, temperature: float = 1.0, with_entropy: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``forward.response_logprobs`` under sequence parallelism: (B, Tr) log-probs (and entropy) of the responses,
    the same on every rank of the group, from this rank's 1/N of the positions. Collective over the group."""
    if "multi_modal_inputs" in batch:
        raise ValueError("actor.ulysses_sp > 1 takes text rows only: these carry image inputs (set actor.ulysses_sp=1)")
    full = batch["responses"].shape[1]
    batch = trim_padding(batch)
    ids, am, pos = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    T, Tr = ids.shape[1], batch["responses"].shape[1]
    t = -(-T // sp.size)
    pad = t * sp.size - T
    ids, am, pos = (F.pad(x, (0, pad)) for x in (ids, am, pos))
    targets = F.pad(ids[:, 1:], (0, 1))                     # column c predicts column c + 1: shifted on the whole row
    first = T - Tr - 1                                      # the column that predicts response token 0
    lo, hi = sp.rank * t, (sp.rank + 1) * t
    a, b = min(max(first, lo), hi), min(max(first + Tr, lo), hi)   # my columns that predict response tokens
    # this forward's group with the whole rows' mask (kept by the call: recomputation in backward reads it again)
    logits = model(input_ids=ids[:, lo:hi], position_ids=pos[:, lo:hi], use_cache=False,
                   ulysses=replace(sp, mask=whole_row_mask(am)),
                   logits_to_keep=torch.arange(a - lo, b - lo, device=ids.device)).logits
    logp, entropy = normalised_logprobs(logits, targets[:, a:b], temperature, with_entropy)
    # my response positions in place, zeros elsewhere; summed over the group: the whole (B, Tr) on every rank
    start = min(max(a - first, 0), Tr)                      # (a rank whose columns predict none: a = b)
    place = (start, Tr - start - (b - a))
    logp = F.pad(_SumOverGroup.apply(F.pad(logp, place), sp.group), (0, full - Tr))
    if with_entropy:
        entropy = F.pad(_SumOverGroup.apply(F.pad(entropy, place), sp.group), (0, full - Tr))
    return logp, entropy
