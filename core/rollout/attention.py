"""Decode (and short-prefill) attention for the embedded rollout engine, plugged into transformers'
``AttentionInterface``.

The model's own attention modules still run (projections, rotary, cache update); only the kernel they call
changes. A one-token decode step over a cache of T positions is a batched matrix-vector product, and PyTorch's
CPU SDPA (a flash kernel built for long queries) was measured at 1.9 ms per layer for 64 sequences x 80
positions on 2 cores, where two batched matmuls took 0.45 ms. So:

- q_len == 1 (decode): the G = heads / kv_heads query heads that share a KV head become the G rows of one
  matmul against that head's keys -- no ``repeat_kv`` copy -- then an fp32 softmax and a matmul with the values.
  Keys and values may be strided views of a larger cache (the slot cache's ``[:n, :, :T]``); they are copied to
  contiguous memory first, which measured faster than batched matmuls over the strided views.
- bf16 or fp32 on CPU with no autograd: the same math in one fused kernel that reads the cache views in place
  (``core.kernels.cpu``; measured 3.9 ms against ~12 ms per SmolLM2 step at batch 64). Prefills with an
  explicit mask take it too, each query row on its own: SDPA's CPU flash kernel took 2.7 ms per layer for the
  bench's 64 prompt tails (16 queries x 43 keys), this one 0.9 ms; 1,024 x 1,024 causal, 14.5 vs 10.6 ms.
- anything else (teacher-forced forwards, training, a prefill with no mask (causal), sliding windows,
  soft-capping, sinks), and everything on a GPU: SDPA, exactly as transformers runs it.

Head order follows ``repeat_kv``: query head h reads KV head h // G.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

from core.kernels import cpu as cpu_kernels

NAME = "hybridrl_decode"


def decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                     **kwargs) -> tuple[torch.Tensor, None]:
    """query (B, H, q, D), key (B, KVH, T, D), value (B, KVH, T, Dv), mask (B, 1, q, T) additive or boolean ->
    (B, q, H, Dv) (Dv differs from D for multi-head latent attention)."""
    B, H, q_len, D = query.shape
    scale = scaling if scaling is not None else D ** -0.5
    sdpa_only = module.training or any(kwargs.get(k) is not None for k in cpu_kernels.UNSUPPORTED_KWARGS)
    if (not sdpa_only and query.dtype in cpu_kernels.KERNEL_DTYPES and query.device.type == "cpu"
            and not torch.is_grad_enabled() and query.shape[-1] % 8 == 0 and value.shape[-1] == query.shape[-1]
            and (attention_mask is not None or q_len == 1)
            and (attention_mask is None or attention_mask.dtype != torch.bool) and cpu_kernels.available()):
        return cpu_kernels.decode_attention(query, key, value, attention_mask, scale), None
    # on a GPU one SDPA kernel beats the ~9 small ones below (a decode step there is bound by kernel count)
    if sdpa_only or q_len != 1 or query.device.type != "cpu":
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    # a strided cache view made CPU bmm 3.4x slower (207 vs 61 us, 64 x 3 heads x 70 positions): copying
    # the live keys and values first is cheaper than the matmul's own handling of the strides
    key, value = key.contiguous(), value.contiguous()
    kv_heads = key.shape[1]
    q = query.reshape(B, kv_heads, H // kv_heads, D)                              # (B, KVH, G, D)
    scores = torch.matmul(q, key.transpose(-1, -2)).float()                       # (B, KVH, G, T)
    scores = scores * scale
    if attention_mask is not None:                                                # (B, 1, 1, T) broadcasts
        scores = (scores.masked_fill(~attention_mask, float("-inf")) if attention_mask.dtype == torch.bool
                  else scores + attention_mask.float())
    probs = scores.softmax(-1).to(value.dtype)
    out = torch.matmul(probs, value)                                              # (B, KVH, G, Dv)
    return out.reshape(B, 1, H, value.shape[-1]), None


AttentionInterface.register(NAME, decode_attention)
# the mask builder goes by the same name: without one, transformers builds no mask at all (padding ignored)
AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS.get("sdpa", sdpa_mask))
