"""Fused module replacements for the rollout engine on a GPU, where a recorded decode step is bound by how many
kernels it runs, not by FLOPs or bytes (``core.rollout.decode_graphs``).

Measured on an H200 (SmolLM2-135M's architecture, bf16, 64 rows, a 128-column cache; ``bench/gpu_session.sh``):
one graph replay ran ~1,350 kernels in 3.42 ms. transformers' RMSNorm is six or seven elementwise kernels (fp32
cast, square, mean, rsqrt, two products, cast back), run twice per layer and once at the end;
``torch.nn.functional.rms_norm`` is one. With it the replay took 2.57 ms and a 64 x 64-token generate 276 against
336 ms.

Like ``cpu_kernels.install``, a replacement goes in only where it reproduces the module on a random input (within
1% of the output's largest magnitude: the fused kernel rounds once, transformers twice), so a norm with other math
(Gemma's ``1 + weight``) keeps its own code; and only for inference: under autograd the module's own forward runs.
"""

from __future__ import annotations

import torch

from core.kernels.cpu import rms_norm_parts, swap_forward


def install(model: torch.nn.Module, device_type: str = "cuda") -> dict[str, int]:
    """Swap in fused forwards on ``model``'s modules whose weights are on ``device_type``; how many of each kind."""
    return {"norms": sum(_install_rms_norm(m, device_type) for m in model.modules())}


def _install_rms_norm(module: torch.nn.Module, device_type: str) -> int:
    parts = rms_norm_parts(module)
    if parts is None or parts[0].device.type != device_type:
        return 0
    (w, eps), own = parts, module.forward

    def fused(x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.dtype != w.dtype:
            return own(x)
        return torch.nn.functional.rms_norm(x, w.shape, w, eps)

    return swap_forward(module, fused, w.shape[0], w.dtype, device=w.device)
