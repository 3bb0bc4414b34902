"""Fused CPU kernels for the rollout engine's decode steps and for training (the bf16 attention, the LM head's
log-softmax), compiled once on first use (``csrc/``).

Why: a SmolLM2 decode step at batch 64 spent ~30 of its ~52 ms outside the linears, in ~1,500 small ops:
- ``decode_attention``: ~12 ms went to attention over the slot cache -- copying each layer's live keys and values
  out of the strided cache, then 192 tiny batched matmuls; PyTorch has no CPU kernel that reads a strided cache
  in place (SDPA's CPU flash kernel is built for long queries: 1.9 ms per layer here). This one reads the cache
  views directly: scores 16 positions at a time (bf16 dot products, fp32 sums), an fp32 softmax, the values.
- ``rms_norm``: the Llama RMSNorm's 8 ops in one pass, the same rounding steps (bit-identical in the tests);
  27 -> 7 us per call, 61 calls a step. ``rotary`` (apply_rotary_pos_emb's ~10 ops per layer, bit-identical) and
  ``silu_mul`` (the gated MLP's activation times up) likewise. ``install`` puts a model on them where they
  reproduce what they replace.
- ``write_decode``: a step's keys and values into the cache, two ``index_put`` (25 us each) -> memcpy.
- ``sample_rows``: temperature sampling straight from the model's logits (no fp32 copy): max, exp-sum and the
  inverse-CDF scan per row in one call, where the PyTorch path took ~8 ops over (64, 49,152) fp32 a step.
bf16: AVX-512 paths (with avx512_bf16 dot products where the CPU has them), scalar fallbacks elsewhere. fp32 (the
engine's dtype on CPUs without bf16 hardware): ``csrc/fp32.cpp``, 8-lane vector code (AVX2 + FMA on x86-64-v3).

Built with ``torch.utils.cpp_extension`` (gcc and ninja; ~11 s on 2 cores) into ``$HYBRIDRL_CACHE/torch_extensions``
and reused by every later process. ``-fopenmp``: ``at::parallel_for`` spreads over torch's threads (without it
the pragma is ignored: one thread, 2x slower). ``-march=native``: the build is for the host's CPU; its folder is
named by the torch version and a hash of the CPU's model and flags. When the build is impossible (no compiler)
the engine keeps its PyTorch path and says so once; ``HYBRIDRL_CPU_KERNELS=0`` turns the kernels off.
``HYBRIDRL_CPU_MARCH=x86-64-v3`` builds for another target instead of this CPU (its own folder): AVX2 + FMA
without AVX-512, the path an AVX2-only CPU takes, testable on an AVX-512 machine. ``isa()`` names the path built.

Each kernel's contract, per path (``isa()``; tests/kernels/test_cpu_kernels.py asserts the one this build takes):
- ``decode_attention``: bf16, within 2e-3 + 0.8% of an fp32 reference (bf16 output rounding); fp32, within 1e-5;
  masked keys weigh exactly 0, and a query's output is the same bits whatever masked keys lie before or after its
  own (its sums start at its first live key, a partial last chunk padded): with the row-wise packed linears, norms
  and sampling, a sequence decodes alike beside any batch neighbours (tests/rollout/test_rollout.py).
- ``rms_norm``: Llama's rounding steps. bf16: bit-identical to LlamaRMSNorm on the AVX-512 path; the other paths
  sum the squares in 16 partial sums in another order than torch does, so an output may differ by one bf16 ulp
  (at most 1 in 1,000 in the tests). fp32: within 2 fp32 ulps (the mean's last bits).
- ``rotary``: bit-identical to Llama's on every path and dtype (elementwise, the same roundings: no FMA
  contraction, ``-ffp-contract=off``); ``write_decode``: exact copies.
- ``silu_mul``: within one bf16 ulp (bf16) or 1e-6 relative (fp32) of torch's silu(gate) * up (its own exp).
- ``sample_rows``: the inverse CDF of the tempered softmax (the same token as a float64 reference), log-prob
  within 1e-5, on every path. ``token_logprobs``: the log-prob of given tokens by the same arithmetic, so the same
  bits for the drawn ones (the trainer's exact forward, ``core.train.exact``).
- ``train_attention_fwd`` / ``_bwd`` (the bf16 training passes' attention, ``core.train.train_attention``):
  AVX512-BF16 only; mean error to the fp32 attention of the same bf16 inputs at most 1.3x SDPA's bf16 one, values
  and gradients; masked keys weigh exactly 0 and get no gradient.
- ``linear_packed`` (bf16): vdpbf16ps on AVX512-BF16 (``linear_native()``), the same sums in vdpbf16ps's order
  elsewhere (bit-identical to a sequential fp32 reference of that order); the engine packs with it where it beats
  oneDNN (AVX-512) and, for ``rollout.exact_logprobs``, everywhere.
Training (any x86-64 path, bf16 and fp32):
- ``head_fold`` / ``head_grad`` (the fused LM head's per-block work, ``core.train.lm_head``): the textbook
  log-probs, entropies and gradients within 1e-5 (fp32), the standard path's within bf16 rounding.
"""


from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

import torch

# attention keyword arguments whose non-None value changes the math: such calls go to SDPA, not our kernels (decode
# and training attention alike)
UNSUPPORTED_KWARGS = ("sliding_window", "softcap", "s_aux", "sinks", "position_bias")

_SOURCES = [Path(__file__).parent / "csrc" / f for f in ("attention.cpp", "elementwise.cpp", "fp32.cpp", "linear.cpp",
                                                                "lm_head.cpp", "ops.cpp", "train_attention.cpp")]
_state: dict[str, bool] = {}


def available() -> bool:
    """True when the kernels are loaded (building them on the first call in this process)."""
    if "ok" not in _state:
        _state["ok"] = _load()
    return _state["ok"]


def isa() -> str | None:
    """The instruction set the loaded kernels' vector paths use: avx512_bf16, avx512, avx2 or scalar (None: not
    loaded)."""
    return torch.ops.hybridrl_cpu.isa() if available() else None


def _load() -> bool:
    if os.environ.get("HYBRIDRL_CPU_KERNELS", "1") == "0":
        return False
    from core.models import cache_dir
    from torch.utils.cpp_extension import load

    march = os.environ.get("HYBRIDRL_CPU_MARCH", "native")
    if not march.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"HYBRIDRL_CPU_MARCH={march!r}: expected a gcc -march value (native, x86-64-v3, ...)")
    tag = _cpu_id() if march == "native" else march
    # keyed by the sources' contents, not their path: a copy of the checkout elsewhere (a Ray job's working_dir, one
    # folder per job) reuses the build where ninja, seeing new paths, would rebuild it (~30 s a job and node)
    build = cache_dir() / "torch_extensions" / (f"cpu_kernels-torch{torch.__version__.replace('+', '-')}-{tag}-"
                                                f"{_sources_hash()}")
    build.mkdir(parents=True, exist_ok=True)
    try:
        if (build / "hybridrl_cpu_kernels.so").is_file() and not (build / "lock").exists():
            torch.ops.load_library(str(build / "hybridrl_cpu_kernels.so"))
        else:
            load(name="hybridrl_cpu_kernels", sources=[str(f) for f in _SOURCES], build_directory=str(build),
                 extra_cflags=["-O3", f"-march={march}", "-fopenmp", "-ffp-contract=off"], is_python_module=False,
                 verbose=False)
    except Exception as err:  # no compiler / ninja, or a build error: the PyTorch path still works
        warnings.warn(f"hybridrl CPU kernels not built ({type(err).__name__}: {str(err)[:200]}); "
                      "the rollout engine runs its PyTorch paths")
        return False
    return True


def _sources_hash() -> str:
    """10 hex digits of the sha256 of ``csrc/`` (every source and header, by name and contents)."""
    h = hashlib.sha256()
    for f in sorted((Path(__file__).parent / "csrc").iterdir()):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:10]


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
    """query (B, H, L, D), key/value (B, KVH, T, D) bf16 or fp32 (strided views are read in place), mask additive
    (B or 1, 1, L or 1, T) -> (B, L, H, D) in their dtype. Scores and softmax in fp32; each query row on its own (a row
    whose keys are all masked gets zeros)."""
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


def install(model: torch.nn.Module) -> dict[str, int]:
    """Put ``model``'s bf16 or fp32 CPU inference on the fused kernels wherever a kernel reproduces what it replaces, checked
    on a random input (a module with other math -- Gemma's ``1 + weight`` norm, a GELU MLP -- fails the check and
    keeps its own code). Every replacement falls back to the original under autograd and for other dtypes or non-CPU
    inputs, so a trainer's backward never runs on them. Returns how many of each kind were installed.

    - ``norms``: modules named ``*RMSNorm`` with a 1-D weight and an epsilon (their ``forward``, per instance);
    - ``mlps``: gated MLPs (``gate_proj``, ``up_proj``, ``down_proj``, ``act_fn``): the activation and product;
    - ``rotary``: the ``apply_rotary_pos_emb`` of the modeling module that defines the model's attention: a
      module-level function the attention calls by name, replaced in that module (process-wide; the same hook
      transformers' own hub-kernel mechanism uses for it).
    """
    return {"norms": sum(_install_rms_norm(m) for m in model.modules()),
            "mlps": sum(_install_gated_mlp(m) for m in model.modules()),
            "rotary": _install_rotary(model)}


# the dtypes the kernels run: bf16 (CPUs with bf16 hardware) and fp32 (the engine's dtype on the others)
KERNEL_DTYPES = (torch.bfloat16, torch.float32)


def _inference(x: torch.Tensor) -> bool:
    return not torch.is_grad_enabled() and x.dtype in KERNEL_DTYPES and x.device.type == "cpu"


def reproduces(want, got) -> bool:
    """``got`` (a kernel's output, or a tuple of them) stands for ``want``: same shapes and dtypes, within 1% of the
    largest value -- a kernel of other math (Gemma's ``1 + weight``) is far off, rounding is not."""
    if not isinstance(want, torch.Tensor):
        return all(reproduces(w, g) for w, g in zip(want, got))
    return (want.shape == got.shape and want.dtype == got.dtype
            and bool((want.float() - got.float()).abs().max() <= 1e-2 * want.float().abs().max()))


def _random(*shape: int, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).mul_(3).to(dtype)


def rms_norm_parts(module: torch.nn.Module) -> tuple[torch.Tensor, float] | None:
    """(weight, epsilon) of a module named ``*RMSNorm`` with a 1-D weight and a float epsilon whose forward is
    still its class's (nothing installed yet); else None."""
    w = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if (not type(module).__name__.lower().endswith("rmsnorm") or not isinstance(w, torch.Tensor) or w.dim() != 1
            or not isinstance(eps, float) or "forward" in module.__dict__):
        return None
    return w, eps


def _install_rms_norm(module: torch.nn.Module) -> int:
    parts = rms_norm_parts(module)
    if parts is None or parts[0].dtype not in KERNEL_DTYPES or parts[0].device.type != "cpu":
        return 0
    (w, eps), own = parts, module.forward
    return swap_forward(module, lambda x: torch.ops.hybridrl_cpu.rms_norm(x, w, eps) if _inference(x) else own(x),
                         w.shape[0], w.dtype)


def _install_gated_mlp(module: torch.nn.Module) -> int:
    gate, up, down = (getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj"))
    if (not all(isinstance(m, torch.nn.Linear) for m in (gate, up, down)) or not hasattr(module, "act_fn")
            or gate.weight.dtype not in KERNEL_DTYPES or gate.weight.device.type != "cpu"
            or "forward" in module.__dict__):
        return 0
    own = module.forward
    return swap_forward(
        module, lambda x: down(torch.ops.hybridrl_cpu.silu_mul(gate(x), up(x))) if _inference(x) else own(x),
        gate.in_features, gate.weight.dtype)


def swap_forward(module: torch.nn.Module, forward, width: int, dtype: torch.dtype, device: str = "cpu") -> int:
    """Install ``forward`` on ``module`` (1) if it reproduces the module's own on a random (2, 3, width) input."""
    x = _random(2, 3, width, dtype=dtype).to(device)
    with torch.no_grad():
        if not reproduces(module.forward(x), forward(x)):
            return 0
    module.forward = forward
    return 1


def _install_rotary(model: torch.nn.Module) -> int:
    """1 when the attention's modeling module runs (or now runs) the fused rotary, else 0."""
    import sys

    for module in model.modules():
        modeling = sys.modules.get(type(module).__module__)
        own = getattr(modeling, "apply_rotary_pos_emb", None)
        if own is None or not hasattr(module, "head_dim") or not callable(own):
            continue
        if getattr(own, "_hybridrl_fused", False):
            return 1

        def fused(q, k, cos, sin, *args, _own=own, **kwargs):
            if (args or kwargs.get("unsqueeze_dim", 1) != 1 or set(kwargs) - {"unsqueeze_dim"} or cos.dim() != 3
                    or not (_inference(q) and _inference(k) and _inference(cos) and _inference(sin))
                    or len({q.dtype, k.dtype, cos.dtype, sin.dtype}) != 1):
                return _own(q, k, cos, sin, *args, **kwargs)
            return torch.ops.hybridrl_cpu.rotary(q, k, cos, sin)

        fused._hybridrl_fused = True
        D = module.head_dim
        for dtype in KERNEL_DTYPES:  # process-wide: it must hold for every dtype it runs
            q = _random(2, 4, 3, D, seed=1, dtype=dtype).transpose(1, 2).contiguous().transpose(1, 2)
            k = _random(2, 2, 3, D, seed=2, dtype=dtype)
            cos, sin = _random(2, 3, D, seed=3, dtype=dtype).div_(3), _random(2, 3, D, seed=4, dtype=dtype).div_(3)
            with torch.no_grad():
                if not reproduces(own(q, k, cos, sin), fused(q, k, cos, sin)):
                    return 0
        modeling.apply_rotary_pos_emb = fused
        return 1
    return 0
