"""The trainer's forward on the embedded rollout engine's own CPU kernels: the log-probs it gives the engine's samples
are the engine's (``rollout_logprobs``), bit for bit.

Why it can be exact: every kernel the engine runs on CPU computes a row from that row alone, in an order fixed by
the row -- the packed linears (each output a K-long sum in one order, whatever the other rows: ``csrc/fp32.cpp``),
RMSNorm, the gated MLP's activation, rotary, attention (a query's live keys summed in their order, masked ones
skipped wherever they lie) and the sampler's log-softmax (``token_logprobs`` shares ``sample_rows``' arithmetic).
A sequence decoded one token at a time and the same sequence teacher-forced in one forward then meet the same
operations on the same numbers. torch's own CPU matmuls and SDPA block by the batch's shape, which is why the
ordinary forward differs in the last bits.

``exact_forward(model)`` switches a model's modules to those kernels for the values and leaves the gradients to
the modules' own math (each backward recomputes the module's ordinary forward and differentiates it): the
gradient is the ordinary one at the exact forward's point. ``response_logprobs_exact`` is the teacher-forced
log-prob pass on it. CPU, fp32 or bf16 (one dtype on both sides; bf16 linears on the packed kernel's
vdpbf16ps-order sums, native or not), where ``core.kernels.cpu`` builds (else ``available`` says why not); the
config check (``core.checks``) refuses what is not shown yet: LoRA, Ulysses, the agent loop. Image prompts: the
vision tower's linears on the same kernels, its full attention on SDPA as the engine runs it.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

from core.kernels import cpu as cpu_kernels
from core.models import keeps_logits
from core.data.vision_inputs import collate, mrope_positions
from core.protocol import Batch
from core.train.forward import _normalise, trim_padding
from core.train.shared_prompt import prompt_groups, shared_prompt_logits

NAME = "hybridrl_exact"


def available(dtype: torch.dtype = torch.float32) -> str:
    """'' where the exact forward runs in ``dtype``, else why not."""
    if not cpu_kernels.available():
        return "our CPU kernels are not built here (HYBRIDRL_CPU_KERNELS=0, or no compiler)"
    if dtype == torch.float32 and not torch.ops.hybridrl_cpu.linear_f32_native():
        return "our packed fp32 linear needs AVX2 + FMA"
    if dtype not in (torch.float32, torch.bfloat16):
        return f"{dtype} is neither fp32 nor bf16"
    return ""


class _KernelValue(torch.autograd.Function):
    """``kernel(*inputs)``'s value, ``reference(*inputs)``'s gradient (recomputed in backward)."""

    @staticmethod
    def forward(ctx, kernel: Callable, reference: Callable, *inputs: torch.Tensor) -> torch.Tensor:
        ctx.reference = reference
        ctx.save_for_backward(*inputs)
        return kernel(*[x.detach() for x in inputs])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        inputs = [x.detach().requires_grad_(need) for x, need in zip(ctx.saved_tensors, ctx.needs_input_grad[2:])]
        wanted = [x for x in inputs if x.requires_grad]
        with torch.enable_grad():
            out = ctx.reference(*inputs)
        grads = iter(torch.autograd.grad(out, wanted, grad, allow_unused=True) if wanted else ())
        return (None, None, *[next(grads) if x.requires_grad else None for x in inputs])


class _Linear(torch.autograd.Function):
    """y = x W^T + b on the engine's packed kernel (W packed per call: the trainer's weights change every step);
    the ordinary gradients."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        packed = torch.ops.hybridrl_cpu.pack_linear(weight.detach())
        b = bias.detach().float().contiguous() if bias is not None else None
        return torch.ops.hybridrl_cpu.linear_packed(x.detach().contiguous(), packed, b, weight.shape[0])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])
        gx = grad @ weight.to(grad.dtype) if ctx.needs_input_grad[0] else None
        gw = (g2.t() @ x.reshape(-1, x.shape[-1]).to(grad.dtype)).to(weight.dtype) if ctx.needs_input_grad[1] else None
        gb = g2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb


# the last mask converted: (transformers' mask or None, L, T, the fp32 additive mask), both tensors by weak
# reference. Every layer of a forward gets the same mask object, and each layer's backward keeps what its forward
# used: one shared conversion, not one per layer (30 copies of (B, 1, L, T) fp32 held until backward for
# SmolLM2), and nothing held once the layers are done with it
_last_mask: tuple = (None, -1, -1, lambda: None)


def _additive(mask: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The kernel's fp32 additive mask (B|1, 1, L, T) from transformers' (boolean, float or None = causal), converted
    once for all the layers that get the same mask."""
    global _last_mask
    L, T = q.shape[2], k.shape[2]
    ref, l_, t_, out_ref = _last_mask
    out = out_ref()
    same = ref is None if mask is None else ref is not None and ref() is mask  # a dead reference matches nothing
    if out is not None and (L, T) == (l_, t_) and same:
        return out
    out = _convert(mask, L, T)
    _last_mask = (None if mask is None else weakref.ref(mask), L, T, weakref.ref(out))
    return out


def _convert(mask: torch.Tensor | None, L: int, T: int) -> torch.Tensor:
    if mask is None:
        allowed = torch.ones(L, T, dtype=torch.bool).tril(T - L)[None, None]
    elif mask.dtype == torch.bool:
        allowed = mask
    else:
        return mask.float().contiguous()
    low = torch.finfo(torch.float32).min  # no row is all -inf: the reference's softmax stays finite on padding
    return torch.zeros(allowed.shape, dtype=torch.float32).masked_fill(~allowed, low).contiguous()


def exact_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                    **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: q (B, H, L, D), k/v (B, KVH, T, D) -> (B, L, H, D), each query row on the
    engine's decode kernel; its gradient is SDPA's (recomputed in backward: its fused CPU backward, not eager
    attention's (B, H, L, T) tensors)."""
    if attention_mask is None and not getattr(module, "is_causal", True):
        # a vision tower's full attention over one image's patches: the engine runs it on SDPA (the prefill's
        # vision inputs), whose result for an image does not depend on the other images beside it
        return sdpa_attention_forward(module, query, key, value, None, scaling=scaling, dropout=dropout, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    mask = _additive(attention_mask, query, key)

    def kernel(q, k, v):
        return torch.ops.hybridrl_cpu.decode_attention(q, k, v, mask, scale)

    def reference(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), scale=scale,
                                                                enable_gqa=True).transpose(1, 2)

    return _KernelValue.apply(kernel, reference, query, key, value), None


AttentionInterface.register(NAME, exact_attention)
AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS.get("sdpa", sdpa_mask))


def _rms_eps(m: torch.nn.Module) -> float | None:
    """A Llama-style RMSNorm's epsilon where the engine's kernel reproduces the module (``cpu_kernels.install``'s
    test: a norm of other math keeps its own code on both sides), else None. Checked on a random input and weight
    (the module's own may be a shard: FSDP2 gathers it only inside the forward)."""
    if (parts := cpu_kernels.rms_norm_parts(m)) is None:
        return None
    g, (w, eps) = torch.Generator().manual_seed(0), parts
    x, w = torch.randn(2, 3, w.shape[0], generator=g, dtype=w.dtype), torch.randn(w.shape[0], generator=g, dtype=w.dtype)
    with torch.no_grad():
        return eps if cpu_kernels.reproduces(_own_forward(m, {"weight": w}, x),
                                             torch.ops.hybridrl_cpu.rms_norm(x, w, eps)) else None


def _own_forward(m: torch.nn.Module, params: dict[str, torch.Tensor], *args):
    """``m``'s class forward with ``params`` in place of its parameters, whatever forward is installed on it (the
    exact one inside ``exact_forward``, a backward's recompute may run there)."""
    with torch.nn.utils.stateless._reparametrize_module(m, params):
        return type(m).forward(m, *args)


def _swaps(model: torch.nn.Module) -> list[tuple[torch.nn.Module, Callable]]:
    """(module, exact forward) for every linear, RMSNorm and gated MLP activation of ``model``; the gradients come
    from each class's own forward (not from a forward the rollout engine installed on a shared model)."""
    out = []
    norms = getattr(model, "_exact_norms", None)
    if norms is None:  # which norms the kernel reproduces: checked once per model
        norms = model._exact_norms = {name: _rms_eps(m) for name, m in model.named_modules()}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            out.append((m, lambda x, m=m: _Linear.apply(x, m.weight, m.bias)))
        elif (eps := norms.get(name)) is not None:
            out.append((m, lambda x, m=m, eps=eps: _KernelValue.apply(
                lambda x_, w_: torch.ops.hybridrl_cpu.rms_norm(x_.contiguous(), w_, eps),
                lambda x_, w_: _own_forward(m, {"weight": w_}, x_), x, m.weight)))
        elif all(isinstance(getattr(m, n, None), torch.nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")) \
                and hasattr(m, "act_fn"):
            out.append((m, lambda x, m=m: m.down_proj(_KernelValue.apply(
                lambda g, u: torch.ops.hybridrl_cpu.silu_mul(g, u), lambda g, u: m.act_fn(g) * u,
                m.gate_proj(x), m.up_proj(x)))))
    return out


@contextmanager
def exact_forward(model: torch.nn.Module) -> Iterator[None]:
    """``model`` runs on the engine's kernels inside the block (its own forwards and attention restored after). The
    engine's rotary kernel is bit-identical to transformers' own (``core.kernels.cpu``): nothing to swap."""
    if why := available():
        raise RuntimeError(f"the exact forward cannot run: {why}")
    swaps = _swaps(model)
    before = model.config._attn_implementation
    installed = [m.__dict__.get("forward") for m, _ in swaps]  # the engine's own, on a model it shares
    for m, forward in swaps:
        m.forward = forward
    model.set_attn_implementation(NAME)
    try:
        yield
    finally:
        for (m, _), prev in zip(swaps, installed):
            if prev is None:
                del m.forward
            else:
                m.forward = prev
        model.set_attn_implementation(before)


class _TokenLogprobs(torch.autograd.Function):
    """log softmax(logits / T)[ids] on the sampler's arithmetic (``token_logprobs``); the ordinary gradient
    (onehot - softmax) / T."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
        ctx.save_for_backward(logits, ids)
        ctx.temperature = temperature
        return torch.ops.hybridrl_cpu.token_logprobs(logits.detach().contiguous(), 1.0 / temperature, ids)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, ids = ctx.saved_tensors
        probs = (logits.float() / ctx.temperature).softmax(-1)
        g = -probs
        g.scatter_add_(-1, ids[:, None], torch.ones_like(ids[:, None], dtype=g.dtype))
        return (g * (grad[:, None] / ctx.temperature)).to(logits.dtype), None, None


def response_logprobs_exact(model: torch.nn.Module, batch: Batch, temperature: float = 1.0, with_entropy: bool = False,
                            remove_padding: bool = True, share_prompt: bool = False
                            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(response_t | context) (B, Tr) under logits / temperature, as the engine computed them when it sampled
    (``rollout_logprobs``): the body and the LM head on the engine's kernels, the log-softmax on the sampler's; and
    the entropy when asked (the ordinary forward's arithmetic: it is no engine output). Differentiable. Keys: input_ids,
    attention_mask, position_ids, responses; zeros after a response's end. The whole model is called (its root
    hooks -- FSDP's gather, the one-rank compute copies -- run), the LM head on the response positions only.
    ``remove_padding`` and ``share_prompt``: the ordinary forward's layouts (``core.train.forward``), the same bits
    -- every kernel computes a token from its own row and its live keys only, so neither the columns dropped nor
    the prompt encoded once for its group's responses changes a number."""
    batch.require("input_ids", "attention_mask", "position_ids", "responses")
    full = batch["responses"].shape[1]
    vision = collate(list(batch["multi_modal_inputs"])) if "multi_modal_inputs" in batch else {}
    if remove_padding:
        batch = trim_padding(batch)
    (B, T), Tr = batch["input_ids"].shape, batch["responses"].shape[1]
    mrope = mrope_positions(model, batch["input_ids"], batch["attention_mask"], vision) if vision else None
    positions = batch["position_ids"] if mrope is None else mrope[0]
    groups = prompt_groups(batch) if share_prompt and keeps_logits(model) and not vision else None
    with exact_forward(model):
        if groups is not None and len(groups) < len(batch):
            logits = shared_prompt_logits(model, batch, groups)
        else:
            keep = {"logits_to_keep": torch.arange(T - Tr - 1, T - 1)} if keeps_logits(model) else {}
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           position_ids=positions, use_cache=False, **keep, **vision).logits
            logits = logits if keep else logits[:, T - Tr - 1:T - 1]
    logits = logits.reshape(B * Tr, -1)
    mask = batch["attention_mask"][:, -Tr:].to(torch.float32)
    ids = batch["responses"].reshape(-1)
    logp = _TokenLogprobs.apply(logits, ids, temperature).view(B, Tr) * mask
    entropy = _normalise(logits, ids, temperature, True)[1].view(B, Tr) * mask if with_entropy else None
    if Tr < full:  # trimmed response columns are padding: zero log-prob and entropy there
        logp = F.pad(logp, (0, full - Tr))
        entropy = F.pad(entropy, (0, full - Tr)) if entropy is not None else None
    return logp, entropy
