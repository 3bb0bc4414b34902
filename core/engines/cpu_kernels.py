"""Fused CPU kernels for the rollout engine's decode steps, compiled once on first use (``cpu_kernels.cpp``).

Why: a SmolLM2 decode step at batch 64 spent ~30 of its ~52 ms outside the linears, in ~1,500 small ops:
- ``decode_attention``: ~12 ms went to attention over the slot cache -- copying each layer's live keys and values
  out of the strided cache, then 192 tiny batched matmuls; PyTorch has no CPU kernel that reads a strided cache
  in place (SDPA's CPU flash kernel is built for long queries: 1.9 ms per layer here). This one reads the cache
  views directly: scores 16 positions at a time (bf16 dot products, fp32 sums), an fp32 softmax, the values.
- ``rms_norm``: the Llama RMSNorm's 8 ops in one pass, the same rounding steps (bit-identical in the tests);
  27 -> 7 us per call, 61 calls a step. ``swap_rms_norms`` installs it on a model's norms that it reproduces.
- ``write_decode``: a step's keys and values into the cache, two ``index_put`` (25 us each) -> memcpy.
- ``sample_rows``: temperature sampling straight from the model's logits (no fp32 copy): max, exp-sum and the
  inverse-CDF scan per row in one call, where the PyTorch path took ~8 ops over (64, 49,152) fp32 a step.
AVX-512 paths (with avx512_bf16 dot products where the CPU has them), scalar fallbacks elsewhere.

Built with ``torch.utils.cpp_extension`` (gcc and ninja; ~7 s on 2 cores) into ``$HYBRIDRL_CACHE/torch_extensions``
and reused by every later process. ``-fopenmp``: ``at::parallel_for`` spreads over torch's threads (without it
the pragma is ignored: one thread, 2x slower). ``-march=native``: the build is for this machine; its folder is
named by the torch version and a hash of the CPU's model and flags. When the build is impossible (no compiler)
the engine keeps its PyTorch path and says so once; ``HYBRIDRL_CPU_KERNELS=0`` turns the kernels off.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch

_SOURCE = Path(__file__).with_suffix(".cpp")
_state: dict[str, bool] = {}


def available() -> bool:
    """True when the kernels are loaded (building them on the first call in this process)."""
    if "ok" not in _state:
        _state["ok"] = _load()
    return _state["ok"]


def _load() -> bool:
    if os.environ.get("HYBRIDRL_CPU_KERNELS", "1") == "0":
        return False
    if hasattr(torch.ops, "hybridrl_cpu") and hasattr(torch.ops.hybridrl_cpu, "decode_attention"):
        return True
    from core.models import cache_dir
    from torch.utils.cpp_extension import load

    build = cache_dir() / "torch_extensions" / f"cpu_kernels-torch{torch.__version__.replace('+', '-')}-{_cpu_id()}"
    build.mkdir(parents=True, exist_ok=True)
    try:
        load(name="hybridrl_cpu_kernels", sources=[str(_SOURCE)], build_directory=str(build),
             extra_cflags=["-O3", "-march=native", "-fopenmp"], is_python_module=False, verbose=False)
    except Exception as err:  # no compiler / ninja, or a build error: the PyTorch path still works
        warnings.warn(f"hybridrl CPU kernels not built ({type(err).__name__}: {str(err)[:200]}); "
                      "the rollout engine runs its PyTorch attention path")
        return False
    return True


def _cpu_id() -> str:
    """A short hash of this CPU's model and flags: a ``-march=native`` build in a home folder shared by several
    machines (a Ray cluster on NFS) must not be loaded by a CPU without the instructions it was built for."""
    import hashlib
    import platform

    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        key = "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags"))}))
    except OSError:
        key = platform.processor() + platform.machine()
    return hashlib.sha1(key.encode()).hexdigest()[:10]


def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                     scale: float) -> torch.Tensor:
    """query (B, H, 1, D), key/value (B, KVH, T, D) bf16 (strided views are read in place), mask additive
    (B or 1, 1, 1, T) -> (B, 1, H, D) bf16. Scores and softmax in fp32."""
    if mask is None:
        mask = query.new_zeros(1, 1, 1, key.shape[2], dtype=torch.float32)
    return torch.ops.hybridrl_cpu.decode_attention(query, key, value, mask.float().contiguous(), scale)


def sample_rows(logits: torch.Tensor, inv_temperature: float, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of ``logits`` (B, V) (bf16 or fp32) drawn from softmax(logits * inv_temperature) by
    inverse CDF with the row's uniform ``u[b]`` (the first index whose cumulative weight exceeds u * total; never
    a zero-weight index); returns (tokens (B,) int64, their log-probs (B,) fp32)."""
    return torch.ops.hybridrl_cpu.sample_rows(logits, inv_temperature, u.float())


def write_decode(k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                 pos: torch.Tensor) -> None:
    """``cache[b, :, pos[b]] = new[b, :, 0]`` for each row b of ``k_new`` / ``v_new`` (n, KVH, 1, D)."""
    torch.ops.hybridrl_cpu.write_decode(k_cache, v_cache, k_new, v_new, pos)


def swap_rms_norms(model: torch.nn.Module) -> int:
    """Run each RMSNorm of ``model`` (a module named ``*RMSNorm`` with a 1-D weight and an epsilon) on the fused
    kernel when it reproduces the module on a random bf16 input; returns how many were swapped. Norms with other
    math (Gemma's ``1 + weight``, a different dtype order) fail the check and keep their own forward. The
    swapped forward falls back to the module's own under autograd or for non-bf16 / non-CPU inputs."""
    swapped = 0
    for module in model.modules():
        w = getattr(module, "weight", None)
        eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
        if (not type(module).__name__.lower().endswith("rmsnorm") or not isinstance(w, torch.Tensor) or w.dim() != 1
                or w.dtype != torch.bfloat16 or w.device.type != "cpu" or not isinstance(eps, float)
                or "forward" in module.__dict__):
            continue
        own = module.forward
        fused = _fused_rms_norm(own, w, eps)
        x = torch.randn(2, 3, w.shape[0], generator=torch.Generator().manual_seed(0)).mul_(3).to(torch.bfloat16)
        with torch.no_grad():
            want, got = own(x), fused(x)
        if want.shape == got.shape and want.dtype == got.dtype and bool(
                (want.float() - got.float()).abs().max() <= 1e-2 * want.float().abs().max()):
            module.forward = fused
            swapped += 1
    return swapped


def _fused_rms_norm(own, weight: torch.Tensor, eps: float):
    def forward(x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.dtype != torch.bfloat16 or x.device.type != "cpu":
            return own(x)
        return torch.ops.hybridrl_cpu.rms_norm(x, weight, eps)
    return forward
