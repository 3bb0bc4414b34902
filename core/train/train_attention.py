"""Attention for the training passes on CPU (teacher-forced log-probs, forward and backward), plugged into
transformers' ``AttentionInterface``.

PyTorch's CPU SDPA runs a flash kernel built for long sequences: for the training micro-batches of the CPU runs
(two shared-prompt rows of 173 positions, SmolLM2's 9 query / 3 KV heads) its forward took 45 ms and its backward
142 ms over 30 layers -- 23% of a forward + backward whose attention is 0.2% of the FLOPs. The same attention as
plain matmuls (scores, an fp32 softmax, values) with autograd measured 1.45x faster for the whole forward +
backward. The price is memory: the (query x key) probabilities stay for backward. So matmuls where those
score tensors are small (``MAX_SCORES`` elements per call), SDPA otherwise and off the CPU.

In bf16 on a CPU with AVX512-BF16 both give way to ``FusedAttention`` (``csrc/train_attention.cpp``): one kernel per
pass, per (row, KV head) in cache, bf16 products summed in fp32, the probabilities recomputed in backward from the
log-sum-exp. For the long GRPO bench's slots (32 x 9 heads x 128 queries x 278 keys, head size 64) SDPA took
~20 ms forward and ~74-86 ms forward + backward per layer; the fused kernel 6 and 21 ms, as close to the fp32
attention of the same inputs as SDPA's bf16 is (tests/train/test_fused_attention.py).

GQA without the ``repeat_kv`` copy: the G = heads / kv_heads query heads of a KV head are one batch of G x q
query rows against that head's keys (query head h reads KV head h // G, as ``repeat_kv`` orders them).
A query row with no visible key (left padding) gets a uniform softmax instead of NaN: its output is unused
and its gradient zero, where a NaN would poison the gradient of everything it multiplies in backward."""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

from core.kernels.cpu import UNSUPPORTED_KWARGS

NAME = "hybridrl_train"
# score elements (batch x heads x queries x keys) per call taken by the matmul path: 2^22 fp32 = 16 MB, and the
# backward keeps about three such tensors per layer (SmolLM2, 30 layers: at most ~1.5 GB at the bound)
MAX_SCORES = 1 << 22


def matmul_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                     scale: float) -> torch.Tensor:
    """query (B, H, q, D), key (B, KVH, T, D), value (B, KVH, T, Dv), mask (B or 1, 1, q, T) boolean (True = attend)
    or additive, or None (causal, the last q of T positions) -> (B, q, H, Dv) (Dv: multi-head latent attention's
    values are narrower than its keys)."""
    B, H, q, D = query.shape
    kvh, T = key.shape[1], key.shape[2]
    # scores in fp32, as SDPA keeps them: rounded to bf16 (spacing 0.125 at 16) the output's mean error was 1.7x SDPA's
    qg = (query.float() * scale).reshape(B, kvh, H // kvh * q, D)           # (B, KVH, G q, D)
    scores = torch.matmul(qg, key.float().transpose(-1, -2)).view(B, kvh, H // kvh, q, T)
    if mask is None:
        mask = torch.ones(q, T, dtype=torch.bool, device=query.device).tril(T - q)
    if mask.dtype == torch.bool:
        allowed = mask if mask.dim() == 2 else mask[:, :, None]             # (B, 1, 1, q, T)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    else:
        scores = scores + mask[:, :, None].to(scores.dtype).clamp(min=torch.finfo(scores.dtype).min)
    # the softmax in fp32, the product with the values in their dtype
    probs = scores.softmax(-1).to(value.dtype).view(B, kvh, H // kvh * q, T)
    out = torch.matmul(probs, value)                                        # (B, KVH, G q, Dv)
    return out.view(B, H, q, value.shape[-1]).transpose(1, 2)


def train_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                    shared_prompt_parts=None, ulysses=None, **kwargs) -> tuple[torch.Tensor, None]:
    """``shared_prompt_parts``: a shared-prompt batch's layout (``core.train.shared_prompt.Parts``, passed by
    its packed forward): the prompt and the slots attend separately, skipping the block mask's empty blocks.
    ``ulysses``: this rank holds a slice of every row's positions (``core.train.ulysses.SequenceParallel``):
    attention over the whole rows for a share of the heads, between two all-to-alls."""
    def attend(q, k, v, mask):
        return _attend(module, q, k, v, mask, scaling, dropout, kwargs)

    if ulysses is not None:
        return ulysses.attention(module, lambda m, q, k, v, mask: _attend(m, q, k, v, mask, scaling, dropout, kwargs),
                                 query, key, value), None
    if shared_prompt_parts is not None and query.shape[2] == key.shape[2]:
        return shared_prompt_parts.attend(attend, query, key, value), None
    return attend(query, key, value, attention_mask), None


class FusedAttention(torch.autograd.Function):
    """bf16 attention in one kernel per pass (``csrc/train_attention.cpp``, AVX512-BF16): query (B, H, q, D), key /
    value (B, KVH, T, D), ``visible`` (B or 1, q, T) uint8 or empty (causal) -> (B, q, H, D). Backward recomputes
    the probabilities from the saved log-sum-exp."""

    @staticmethod
    def forward(ctx, query, key, value, visible, scale: float):
        out, lse = torch.ops.hybridrl_cpu.train_attention_fwd(query, key, value, visible, scale)
        ctx.save_for_backward(query, key, value, out, lse, visible)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, out, lse, visible = ctx.saved_tensors
        dq, dk, dv = torch.ops.hybridrl_cpu.train_attention_bwd(grad_out.contiguous(), query, key, value, out, lse,
                                                                visible, ctx.scale)
        return dq, dk, dv, None, None


def fused_attention_ok(query: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Can ``FusedAttention`` take this call? bf16 on a CPU whose kernels were built with AVX512-BF16, head size a
    multiple of 32, a boolean (B or 1, 1, q, T) mask or none."""
    from core.kernels import cpu as cpu_kernels

    boolean = mask is None or (mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1] == 1
                               and mask.shape[0] in (1, query.shape[0]))
    return (query.dtype == torch.bfloat16 and query.shape[-1] % 32 == 0 and boolean
            and cpu_kernels.isa() == "avx512_bf16")


def _attend(module, query, key, value, attention_mask, scaling, dropout, kwargs) -> torch.Tensor:
    B, H, q, D = query.shape
    small = B * H * q * key.shape[2] <= MAX_SCORES
    scale = scaling if scaling is not None else D ** -0.5
    mask = attention_mask[..., :key.shape[2]] if attention_mask is not None else None
    if mask is None and not getattr(module, "is_causal", True):  # a vision encoder: no mask means all keys, not causal
        mask = torch.ones(1, 1, q, key.shape[2], dtype=torch.bool, device=query.device)
    # a call whose keyword arguments change the attention math (sliding window, soft-capping, ...) goes to SDPA
    if (query.device.type == "cpu" and dropout == 0.0 and H % key.shape[1] == 0
            and not any(kwargs.get(k) is not None for k in UNSUPPORTED_KWARGS)):
        if fused_attention_ok(query, mask) and value.shape[-1] == D:
            visible = (mask[:, 0].contiguous().view(torch.uint8) if mask is not None
                       else torch.empty(0, dtype=torch.uint8))
            return FusedAttention.apply(query.contiguous(), key.contiguous(), value.contiguous(), visible, scale)
        if small:
            return matmul_attention(query, key, value, mask, scale)
    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                  **kwargs)[0]


AttentionInterface.register(NAME, train_attention)
# the mask builder goes by the same name: without one, transformers builds no mask at all (padding ignored)
AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS.get("sdpa", sdpa_mask))
