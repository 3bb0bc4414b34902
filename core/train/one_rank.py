"""One rank, nothing to shard: FSDP2's mixed precision without FSDP2's gather and reduce machinery.

On one rank FSDP2 still copies every parameter into an all-gather buffer and out again, casting it, twice per
micro-batch (forward and backward's re-gather), and every gradient into a reduce-scatter buffer and back: on
SmolLM2-135M in bf16 about a third of an update's time on a 2-core CPU. Here the numbers are the same and the
work is done once per weight update:

- the fp32 parameters stay registered on the model (the optimizer's master copy; checkpoints, weight export and
  ``clip_grad_norm_`` see them as before);
- a forward pre-hook on the root swaps each one for its compute-dtype copy, re-cast only when the fp32 value
  changed since (``stale`` after an optimizer step or a checkpoint load, or its in-place version counter moved);
  a forward hook swaps
  the fp32 ones back (autograd keeps the copies it saved for backward);
- each copy's gradient, once accumulated, is added in fp32 to its fp32 parameter's ``.grad`` and dropped -- what
  FSDP2 with ``reduce_dtype=float32`` does on one rank (cast, a one-rank reduce, accumulate), in the same order.

Memory: each model keeps its whole compute-dtype copy (2P bytes in bf16; a frozen reference's is cast once and
kept), where FSDP2 holds a layer or two at a time -- ``core.planner`` counts it.

Only where nothing reads the module's parameters outside the root's forward while gradients flow: not with
activation checkpointing (backward re-runs layers, which would find the fp32 parameters), and not with FSDP2
offload. ``core.train.sharding.shard`` decides; tests/train/test_one_rank.py checks the equivalence.
"""

from __future__ import annotations

import torch


class ComputeCopies:
    """The compute-dtype twins of a model's fp32 parameters, swapped in for the root module's forward."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype):
        self.dtype = dtype
        # (module, attribute, fp32 parameter) for every registration: a tied weight is registered twice, one copy
        self.slots = [(m, name, p) for m in model.modules() for name, p in m._parameters.items() if p is not None]
        self.copies: dict[int, torch.nn.Parameter] = {}   # id(fp32 parameter) -> its copy
        self.cast: dict[int, int | None] = {}             # id(fp32 parameter) -> its version when last cast
        # the fp32 gradients' storage, kept across optimizer steps: a fresh 4P-byte allocation per step cost
        # ~0.1 s of page faults on the 2-core CPU (the optimizer's zero_grad sets .grad to None, not this)
        self.grads: dict[int, torch.Tensor] = {}
        model._compute_copies = self  # for ``stale``
        model.register_forward_pre_hook(self._swap_in)
        model.register_forward_hook(self._swap_out, always_call=True)

    def stale(self) -> None:
        """The fp32 values changed where the version counter may not show it (the fused AdamW kernel writes in place
        without bumping it): every copy is re-cast at its next use."""
        self.cast = dict.fromkeys(self.cast)

    def copy_of(self, p: torch.nn.Parameter) -> torch.nn.Parameter:
        c = self.copies.get(id(p))
        if c is None or c.device != p.device:
            c = torch.nn.Parameter(p.detach().to(self.dtype), requires_grad=p.requires_grad)
            if p.requires_grad:
                c.register_post_accumulate_grad_hook(lambda c, p=p: self._fold(c, p))
            self.copies[id(p)] = c
        elif self.cast[id(p)] != p._version:
            with torch.no_grad():  # re-cast into the same storage (a backward still pending on it would raise)
                c.copy_(p)
        self.cast[id(p)] = p._version
        return c

    @torch.no_grad()
    def _fold(self, c: torch.nn.Parameter, p: torch.nn.Parameter) -> None:
        if p.grad is None:
            buf = self.grads.get(id(p))
            if buf is None or buf.shape != p.shape or buf.device != p.device:
                buf = self.grads[id(p)] = torch.empty_like(p, dtype=torch.float32)
            p.grad = buf.copy_(c.grad)
        else:
            add_into(p.grad, c.grad)
        c.grad = None

    def _swap_in(self, module, args) -> None:
        for m, name, p in self.slots:
            m._parameters[name] = self.copy_of(p)

    def _swap_out(self, module, args, output) -> None:
        for m, name, p in self.slots:
            m._parameters[name] = p


FOLD_CHUNK = 1 << 20


def add_into(acc: torch.Tensor, g: torch.Tensor) -> None:
    """``acc += g`` for an fp32 ``acc`` and a lower-precision ``g``, the same sums: a tile of ``g`` at a time made
    fp32 and added. PyTorch's mixed-dtype in-place add converts element by element: 44.6 ms for the 28M-entry
    embedding gradient (bf16 into fp32) on a 2-core EPYC, against 7.8 ms in 1M-entry tiles (a 4 MB scratch the
    allocator reuses)."""
    if g.dtype == acc.dtype or acc.numel() <= FOLD_CHUNK or not (acc.is_contiguous() and g.is_contiguous()):
        acc += g
        return
    a, b = acc.view(-1), g.view(-1)
    for i in range(0, a.numel(), FOLD_CHUNK):
        a[i:i + FOLD_CHUNK] += b[i:i + FOLD_CHUNK].to(acc.dtype)


def weights_changed(model: torch.nn.Module) -> None:
    """Call after writing a model's parameters in place: its compute copies, if it has them, are re-cast."""
    copies = getattr(model, "_compute_copies", None)
    if copies is not None:
        copies.stale()
