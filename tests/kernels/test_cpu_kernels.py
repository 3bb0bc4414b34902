"""core.kernels.cpu: the fused decode attention equals an fp32 reference on strided cache views (both
vectorised head sizes, the scalar fallback, tails of positions, masks); the fused RMSNorm and rotary are
bit-identical to Llama's, SiLU*up within a bf16 ulp; kernels are installed only where they reproduce the module;
write_decode equals the index_put it replaces; sample_rows is the inverse CDF of the tempered softmax; a bf16
engine on the kernels keeps its log-probs consistent with a teacher-forced forward."""

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama import modeling_llama
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from core.kernels import cpu as cpu_kernels
from core.rollout.packed import can_pack
from core.config import SamplingParams
from core.rollout.engine import RolloutEngine
from core.models import cache_dir, load_causal_lm, load_tokenizer

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="CPU kernels could not be built here")
bf16 = torch.bfloat16
ROOT = Path(__file__).resolve().parents[2]


def reference_attention(q, k, v, mask, scale):
    """fp32 math on the same bf16 inputs: q (B, H, L, D), k/v (B, KVH, T, D), additive mask (B|1, 1, L|1, T)."""
    G = q.shape[1] // k.shape[1]
    kf, vf = k.float().repeat_interleave(G, 1), v.float().repeat_interleave(G, 1)
    s = q.float() @ kf.transpose(-1, -2) * scale + mask.float()
    return (s.softmax(-1) @ vf).transpose(1, 2)                                 # (B, L, H, D)


@pytest.mark.parametrize("B,H,KVH,D,T", [(5, 9, 3, 64, 80), (4, 4, 4, 128, 37), (3, 6, 2, 48, 21), (2, 8, 1, 64, 5)])
def test_decode_attention_equals_fp32_reference_on_strided_views(B, H, KVH, D, T):
    g = torch.Generator().manual_seed(B * 100 + T)
    cache_k = torch.randn(B + 3, KVH, T + 9, D, generator=g).to(bf16)
    cache_v = torch.randn(B + 3, KVH, T + 9, D, generator=g).to(bf16)
    k, v = cache_k[:B, :, :T], cache_v[:B, :, :T]                              # strided, as the slot cache passes
    q = torch.randn(B, 1, H, D, generator=g).to(bf16).transpose(1, 2)          # (B, H, 1, D), strided like HF's
    allowed = torch.rand(B, 1, 1, T, generator=g) > 0.3
    allowed[0, ..., :T // 2] = False                                            # a long left padding
    allowed[..., -1] = True
    mask = torch.zeros(B, 1, 1, T).masked_fill(~allowed, torch.finfo(bf16).min)
    got = cpu_kernels.decode_attention(q, k, v, mask.to(bf16), scale=D ** -0.5)
    want = reference_attention(q, k, v, mask, D ** -0.5)
    assert got.dtype == bf16 and got.shape == (B, 1, H, D)
    # the kernel rounds only its output to bf16: within half a bf16 ulp of the fp32 result (plus summation order)
    torch.testing.assert_close(got.float(), want, atol=2e-3, rtol=8e-3)
    # masked positions carry no weight: changing their keys and values changes nothing
    k2, v2 = k.clone(), v.clone()
    k2.masked_fill_(~allowed.transpose(-1, -2), 7.0)
    v2.masked_fill_(~allowed.transpose(-1, -2), -7.0)
    assert torch.equal(cpu_kernels.decode_attention(q, k2, v2, mask, scale=D ** -0.5), got)
    # ... whatever they hold: NaN there (which any product with them spreads) gives the same bits
    k2.masked_fill_(~allowed.transpose(-1, -2), float("nan"))
    v2.masked_fill_(~allowed.transpose(-1, -2), float("nan"))
    assert torch.equal(cpu_kernels.decode_attention(q, k2, v2, mask, scale=D ** -0.5), got)


@pytest.mark.parametrize("B,H,KVH,D,L,T", [(4, 9, 3, 64, 16, 43), (2, 4, 2, 128, 5, 33), (3, 6, 3, 48, 4, 9)])
def test_multi_query_attention_equals_fp32_reference_with_causal_and_padding_masks(B, H, KVH, D, L, T):
    """A prefill's L query rows, each with its own mask row (the last L of T positions, causal, left padding);
    a query row whose keys are all masked (a padding row) gets zeros, not NaN."""
    g = torch.Generator().manual_seed(L * 10 + T)
    cache_k, cache_v = (torch.randn(B + 1, KVH, T + 4, D, generator=g).to(bf16) for _ in range(2))
    k, v = cache_k[:B, :, :T], cache_v[:B, :, :T]
    q = torch.randn(B, L, H, D, generator=g).to(bf16).transpose(1, 2)          # (B, H, L, D), strided
    col, row = torch.arange(T), torch.arange(T - L, T)
    start = torch.arange(B) % 3                                                 # left padding per sequence
    allowed = (col[None, None, None] <= row[None, None, :, None]) & (col >= start[:, None, None, None])
    mask = torch.zeros(B, 1, L, T).masked_fill(~allowed, float("-inf"))
    got = cpu_kernels.decode_attention(q, k, v, mask.to(bf16), scale=D ** -0.5)
    assert got.shape == (B, L, H, D)
    torch.testing.assert_close(got.float(), reference_attention(q, k, v, mask, D ** -0.5), atol=2e-3, rtol=8e-3)
    mask[1, :, 0] = float("-inf")                                               # row 0 of sequence 1 sees nothing
    got = cpu_kernels.decode_attention(q, k, v, mask.to(bf16), scale=D ** -0.5)
    assert torch.equal(got[1, 0], torch.zeros(H, D, dtype=bf16)) and not got.isnan().any()
    # the engine's masks hold the dtype's min, not -inf: the same row, the same zeros
    got = cpu_kernels.decode_attention(q, k, v, mask.clamp(min=torch.finfo(bf16).min).to(bf16), scale=D ** -0.5)
    assert torch.equal(got[1, 0], torch.zeros(H, D, dtype=bf16)) and not got.isnan().any()


def test_the_build_names_its_path():
    """isa() is the vector path compiled in; HYBRIDRL_CPU_MARCH=x86-64-v3 builds the AVX2 one on any x86-64 CPU."""
    import os

    assert cpu_kernels.isa() in ("avx512_bf16", "avx512", "avx2", "scalar")
    if os.environ.get("HYBRIDRL_CPU_MARCH") == "x86-64-v3":
        assert cpu_kernels.isa() == "avx2"
    assert torch.ops.hybridrl_cpu.linear_native() == (cpu_kernels.isa() == "avx512_bf16")


def test_a_copy_of_the_checkout_elsewhere_loads_the_same_build(tmp_path):
    """The build is keyed by the sources' contents: core/ copied to another folder (as a Ray job's working_dir is)
    loads the built library as it is -- ninja, given new source paths, would rebuild it (~30 s a job)."""
    import os
    import shutil
    import subprocess
    import sys

    from core.kernels.cpu import _sources_hash

    built = list((cache_dir() / "torch_extensions").glob(f"cpu_kernels-*-{_sources_hash()}/hybridrl_cpu_kernels.so"))
    assert built, "this process's build is keyed by the sources' hash"
    stamps = {p: p.stat().st_mtime_ns for p in built}
    shutil.copytree(ROOT / "core", tmp_path / "core", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", "import core.kernels.cpu as k; print(k.available(), k.__file__)"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["True", str(tmp_path / "core" / "kernels" / "cpu.py")], r.stdout + r.stderr
    assert {p: p.stat().st_mtime_ns for p in built} == stamps  # loaded, not rebuilt
    with (tmp_path / "core" / "kernels" / "csrc" / "kernels.h").open("a") as f:
        f.write("// changed\n")
    assert _sources_hash() != subprocess.run(
        [sys.executable, "-c", "from core.kernels.cpu import _sources_hash as h; print(h())"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=60).stdout.strip()  # changed sources: another build


def test_decode_attention_without_mask_and_broadcast_mask():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, 6, 1, 64, generator=g).to(bf16)
    k, v = torch.randn(3, 2, 19, 64, generator=g).to(bf16), torch.randn(3, 2, 19, 64, generator=g).to(bf16)
    zero = torch.zeros(1, 1, 1, 19)
    want = reference_attention(q, k, v, zero, 0.125)
    torch.testing.assert_close(cpu_kernels.decode_attention(q, k, v, None, 0.125).float(), want, atol=2e-3, rtol=8e-3)
    torch.testing.assert_close(cpu_kernels.decode_attention(q, k, v, zero, 0.125).float(), want, atol=2e-3, rtol=8e-3)


@pytest.mark.parametrize("shape", [(64, 1, 576), (3, 17, 576), (2, 5, 100), (7, 64)])
def test_rms_norm_keeps_its_contract_with_llama_rmsnorm(shape):
    """The contract of the path this build takes (cpu_kernels' docstring): bit-identical on AVX-512 (N % 16 == 0:
    the vector loop); elsewhere within one bf16 ulp, at most 1 output in 1,000 off by it."""
    g = torch.Generator().manual_seed(shape[-1])
    norm = LlamaRMSNorm(shape[-1], eps=1e-5).to(bf16)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(shape[-1], generator=g))
        x = (torch.randn(*shape, generator=g) * 3).to(bf16)
        got, want = torch.ops.hybridrl_cpu.rms_norm(x, norm.weight, 1e-5), norm(x)
    if cpu_kernels.isa().startswith("avx512") and shape[-1] % 16 == 0:
        assert torch.equal(got, want)
    else:
        diff = (got.float() - want.float()).abs()
        assert bool((diff <= want.float().abs() * 2 ** -7).all()), diff.max()
        assert (got != want).float().mean() <= 1e-3


class OnePlusWeightRMSNorm(torch.nn.Module):
    """Gemma's variant: scales by (1 + weight). Same name pattern, different math: must not be swapped."""

    def __init__(self, n):
        super().__init__()
        self.weight, self.eps = torch.nn.Parameter(torch.randn(n, dtype=bf16)), 1e-6

    def forward(self, x):
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)


def test_install_only_where_the_kernel_reproduces_the_module():
    model = torch.nn.ModuleDict({"a": LlamaRMSNorm(64).to(bf16), "b": OnePlusWeightRMSNorm(64),
                                 "c": LlamaRMSNorm(64).double(),            # fp64 weights: no kernel's dtype
                                 "mlp": LlamaMLP(LlamaConfig(hidden_size=64, intermediate_size=96)).to(bf16),
                                 "gelu": LlamaMLP(LlamaConfig(hidden_size=64, intermediate_size=96,
                                                             hidden_act="gelu")).to(bf16)})
    assert cpu_kernels.install(model) == {"norms": 1, "mlps": 1, "rotary": 0}
    assert "forward" in model["a"].__dict__ and "forward" not in model["b"].__dict__
    assert "forward" not in model["c"].__dict__
    assert "forward" in model["mlp"].__dict__ and "forward" not in model["gelu"].__dict__
    assert cpu_kernels.install(model) == {"norms": 0, "mlps": 0, "rotary": 0}  # already installed: left alone
    x = torch.randn(4, 64).to(bf16)
    with torch.no_grad():
        fused = model["a"](x)
    y = model["a"](x.requires_grad_())                                        # autograd: the module's own forward
    assert y.requires_grad and torch.equal(y.detach(), fused)


def test_write_decode_equals_index_put():
    g = torch.Generator().manual_seed(2)
    k, v = torch.randn(8, 3, 20, 64, generator=g).to(bf16), torch.randn(8, 3, 20, 64, generator=g).to(bf16)
    kn = torch.randn(5, 1, 3, 64, generator=g).to(bf16).transpose(1, 2)      # (n, KVH, 1, D) strided
    vn = torch.randn(5, 1, 3, 64, generator=g).to(bf16).transpose(1, 2)
    pos = torch.tensor([3, 7, 0, 19, 5])
    k2, v2 = k.clone(), v.clone()
    k2[torch.arange(5), :, pos] = kn[:, :, 0]
    v2[torch.arange(5), :, pos] = vn[:, :, 0]
    cpu_kernels.write_decode(k, v, kn, vn, pos)
    assert torch.equal(k, k2) and torch.equal(v, v2)
    with pytest.raises(RuntimeError, match="position out of the cache"):
        cpu_kernels.write_decode(k, v, kn, vn, torch.tensor([3, 7, 0, 20, 5]))


def test_bf16_engine_on_the_kernels_matches_a_teacher_forced_forward(tiny_model_dir):
    """The engine's bf16 decode (fused attention, norms, linears, cache writes) against the model's own SDPA forward over
    the generated sequences: the sampled tokens' log-probs agree to bf16 accuracy."""
    path = str(tiny_model_dir)
    model, tok = load_causal_lm(path, dtype=bf16), load_tokenizer(path)
    engine = RolloutEngine(model, tok, max_batch_size=8)
    L = model.config.num_hidden_layers
    assert engine.fused == {"norms": 2 * L + 1, "mlps": L, "rotary": 1}
    assert getattr(modeling_llama.apply_rotary_pos_emb, "_hybridrl_fused", False)
    if can_pack(model):  # AVX-512 or bf16 hardware: packed linears, ours where faster (packed.kernel_usable)
        assert all(g.kernel for g in engine.packed.groups) == (cpu_kernels.isa() in ("avx512_bf16", "avx512"))
    else:  # no bf16 dot products on this CPU (AVX2 only): the model's own linears, unpacked
        assert engine.packed is None
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16, 17]]
    out = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=24, ignore_eos=True, seed=3))
    reference = load_causal_lm(path, dtype=bf16)  # SDPA, own norms and MLPs, no packing (rotary: bit-identical)
    with torch.no_grad():
        logits = reference(input_ids=out["input_ids"], attention_mask=out["attention_mask"],
                           position_ids=out["position_ids"]).logits.float()
    Tp = out["prompts"].shape[1]
    logp = logits[:, Tp - 1:-1].log_softmax(-1).gather(-1, out["responses"][..., None]).squeeze(-1)
    diff = (logp - out["rollout_logprobs"]).abs()[out["response_mask"] > 0]
    assert diff.max() < 0.1 and diff.mean() < 0.02, (diff.max(), diff.mean())


@pytest.mark.parametrize("dtype,V", [(bf16, 49152), (torch.float32, 1000), (bf16, 37)])
def test_sample_rows_is_the_inverse_cdf_of_the_tempered_softmax(dtype, V):
    g = torch.Generator().manual_seed(V)
    logits = (torch.randn(6, V, generator=g) * 4).to(dtype)
    logits[:, 5] = float("-inf")                                              # a masked token: weight exactly 0
    u = torch.rand(6, generator=g)
    tok, logp = cpu_kernels.sample_rows(logits, 1 / 0.7, u)
    x = logits.double() / 0.7
    probs = x.softmax(-1)
    cdf = probs.cumsum(-1)
    want = torch.searchsorted(cdf, u.double()[:, None] * cdf[:, -1:], right=True).squeeze(-1)
    assert torch.equal(tok, want) and not bool((tok == 5).any())
    torch.testing.assert_close(logp.double(), x.log_softmax(-1).gather(-1, tok[:, None]).squeeze(-1),
                               atol=1e-5, rtol=0)


def test_sample_rows_draws_the_distribution_and_never_a_zero():
    probs = torch.tensor([0.5, 0.0, 0.3, 0.2] + [0.0] * 29)                 # 33 entries: a vector block and a tail
    logits = probs.log()[None].repeat(20000, 1)
    tok, _ = cpu_kernels.sample_rows(logits, 1.0, torch.rand(20000, generator=torch.Generator().manual_seed(0)))
    freq = torch.bincount(tok, minlength=33).float() / len(tok)
    assert freq[1] == 0 and freq[4:].sum() == 0
    torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)
    edge, _ = cpu_kernels.sample_rows(logits[:2], 1.0, torch.tensor([0.0, 1.0 - 1e-7]))
    assert edge.tolist() == [0, 3]                                            # u -> 0: the first; u -> 1: the last live


def test_rotary_is_bit_identical_to_llamas_and_falls_back_under_autograd():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(3, 1, 9, 64, generator=g).to(bf16).transpose(1, 2)       # (B, H, T=1, D) as HF passes it
    k = torch.randn(3, 3, 1, 64, generator=g).to(bf16)
    cos, sin = torch.randn(3, 1, 64, generator=g).to(bf16), torch.randn(3, 1, 64, generator=g).to(bf16)
    rot = modeling_llama.rotate_half  # Llama's formula spelled out with its own rotate_half (eager bf16 ops)
    got_q, got_k = torch.ops.hybridrl_cpu.rotary(q, k, cos, sin)
    assert torch.equal(got_q, q * cos[:, None] + rot(q) * sin[:, None])
    assert torch.equal(got_k, k * cos[:, None] + rot(k) * sin[:, None])
    q7, k7 = torch.randn(2, 4, 7, 64, generator=g).to(bf16), torch.randn(2, 2, 7, 64, generator=g).to(bf16)
    c7, s7 = torch.randn(2, 7, 64, generator=g).to(bf16), torch.randn(2, 7, 64, generator=g).to(bf16)
    got = torch.ops.hybridrl_cpu.rotary(q7, k7, c7, s7)                      # a prefill: several positions
    assert torch.equal(got[0], q7 * c7[:, None] + rot(q7) * s7[:, None])
    assert torch.equal(got[1], k7 * c7[:, None] + rot(k7) * s7[:, None])
    # the installed function: the module's own code under autograd (a trainer's backward), the kernel without
    attention = modeling_llama.LlamaAttention(LlamaConfig(hidden_size=576, num_attention_heads=9,
                                                          num_key_value_heads=3), layer_idx=0).to(bf16)
    assert cpu_kernels.install(attention)["rotary"] == 1
    fused = modeling_llama.apply_rotary_pos_emb
    assert fused._hybridrl_fused
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(fused(q, k, cos, sin), (got_q, got_k)))
    out_q, _ = fused(q.detach().clone().requires_grad_(), k, cos, sin)
    assert out_q.requires_grad and torch.equal(out_q.detach(), got_q)


def test_silu_mul_matches_the_gated_mlp_activation_on_strided_slices():
    g = torch.Generator().manual_seed(6)
    fused = (torch.randn(5, 1, 2 * 200, generator=g) * 4).to(bf16)           # one gate|up product, as packed
    gate, up = fused.split(200, dim=-1)
    want = torch.nn.functional.silu(gate) * up
    got = torch.ops.hybridrl_cpu.silu_mul(gate, up)
    assert got.shape == want.shape
    # torch's silu and ours may round one value to the neighbouring bf16: at most 1 ulp, on few elements
    diff = (got.float() - want.float()).abs()
    assert bool((diff <= want.float().abs() * 2 ** -7 + 1e-30).all()) and (got != want).float().mean() < 0.02


# ------------------------------------------------------------------ fp32 (the engine's dtype without bf16 hardware)
f32 = torch.float32


@pytest.mark.parametrize("B,H,KVH,D,L,T", [(5, 9, 3, 64, 1, 80), (3, 7, 1, 128, 1, 37), (2, 6, 2, 24, 5, 9),
                                           (4, 8, 2, 64, 16, 43)])
def test_fp32_attention_equals_the_reference_on_strided_views(B, H, KVH, D, L, T):
    """Decode (L = 1) and prefill tails (L > 1, causal + padding): within 1e-5 of the fp32 reference; a padding row
    that sees nothing gets zeros; masked keys weigh nothing."""
    g = torch.Generator().manual_seed(B * 10 + T)
    cache_k, cache_v = (torch.randn(B + 2, KVH, T + 5, D, generator=g) for _ in range(2))
    k, v = cache_k[:B, :, :T], cache_v[:B, :, :T]
    q = torch.randn(B, L, H, D, generator=g).transpose(1, 2)                   # (B, H, L, D), strided
    col, row = torch.arange(T), torch.arange(T - L, T)
    allowed = (col[None, None, None] <= row[None, None, :, None]) & (torch.rand(B, 1, 1, T, generator=g) > 0.3)
    allowed[..., -1] |= L == 1
    allowed[0, :, 0] = False                                                   # row 0 of sequence 0 sees nothing
    mask = torch.zeros(B, 1, L, T).masked_fill(~allowed, float("-inf"))
    got = cpu_kernels.decode_attention(q, k, v, mask, scale=D ** -0.5)
    want = reference_attention(q, k, v, mask.clamp(min=-1e30), D ** -0.5)
    want[0, 0] = 0
    assert got.dtype == f32 and got.shape == (B, L, H, D)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    k2 = k.clone().masked_fill_(~allowed.any(2, keepdim=True).transpose(-1, -2), 9.0)
    assert torch.equal(cpu_kernels.decode_attention(q, k2, v, mask, scale=D ** -0.5), got)
    if L == 1:  # keys no query sees are never used: NaN there gives the same bits
        unseen = ~allowed.transpose(-1, -2)
        k3, v3 = k.clone().masked_fill_(unseen, float("nan")), v.clone().masked_fill_(unseen, float("nan"))
        assert torch.equal(cpu_kernels.decode_attention(q, k3, v3, mask, scale=D ** -0.5), got)


@pytest.mark.parametrize("shape", [(64, 1, 576), (3, 5, 100), (7, 60)])
def test_fp32_rms_norm_is_llamas_to_two_ulps(shape):
    g = torch.Generator().manual_seed(shape[-1])
    norm = LlamaRMSNorm(shape[-1], eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(shape[-1], generator=g))
        x = torch.randn(*shape, generator=g) * 3
        got, want = torch.ops.hybridrl_cpu.rms_norm(x, norm.weight, 1e-5), norm(x)
    torch.testing.assert_close(got, want, atol=0, rtol=2 * 2 ** -23)


def test_fp32_rotary_is_bit_identical_to_llamas():
    g = torch.Generator().manual_seed(7)
    rot = modeling_llama.rotate_half
    for D, T in ((64, 1), (64, 7), (36, 3)):                                   # 36: a half that is no multiple of 8
        q = torch.randn(3, T, 9, D, generator=g).transpose(1, 2)               # (B, H, T, D) strided, as HF passes it
        k = torch.randn(3, 3, T, D, generator=g)
        cos, sin = torch.randn(3, T, D, generator=g), torch.randn(3, T, D, generator=g)
        got_q, got_k = torch.ops.hybridrl_cpu.rotary(q, k, cos, sin)
        assert torch.equal(got_q, q * cos[:, None] + rot(q) * sin[:, None])
        assert torch.equal(got_k, k * cos[:, None] + rot(k) * sin[:, None])


def test_fp32_silu_mul_matches_torch_on_strided_slices():
    g = torch.Generator().manual_seed(8)
    fused = torch.randn(5, 1, 2 * 203, generator=g) * 6                      # 203: a tail after the vector blocks
    gate, up = fused.split(203, dim=-1)
    got = torch.ops.hybridrl_cpu.silu_mul(gate, up)
    torch.testing.assert_close(got, torch.nn.functional.silu(gate) * up, atol=1e-6, rtol=1e-6)


def test_fp32_engine_on_the_kernels_matches_a_teacher_forced_forward(tiny_model_dir):
    """An fp32 engine runs the fused kernels (norms, MLPs, rotary, attention on the cache) and its sampled tokens'
    log-probs equal a teacher-forced SDPA forward of the plain model to fp32 accuracy."""
    path = str(tiny_model_dir)
    model, tok = load_causal_lm(path, dtype=f32), load_tokenizer(path)
    engine = RolloutEngine(model, tok, max_batch_size=8)
    L = model.config.num_hidden_layers
    assert engine.fused == {"norms": 2 * L + 1, "mlps": L, "rotary": 1}
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16, 17]]
    out = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=24, ignore_eos=True, seed=3))
    reference = load_causal_lm(path, dtype=f32)
    with torch.no_grad():
        logits = reference(input_ids=out["input_ids"], attention_mask=out["attention_mask"],
                           position_ids=out["position_ids"]).logits
    Tp = out["prompts"].shape[1]
    logp = logits[:, Tp - 1:-1].log_softmax(-1).gather(-1, out["responses"][..., None]).squeeze(-1)
    diff = (logp - out["rollout_logprobs"]).abs()[out["response_mask"] > 0]
    assert diff.max() < 1e-4, diff.max()


@pytest.mark.parametrize("dtype", [bf16, torch.float32])
@pytest.mark.parametrize("D,T", [(64, 37), (128, 21), (48, 9)])
def test_a_query_attends_alike_whatever_masked_keys_lie_before_or_after(dtype, D, T):
    """Batch invariance: a decode query's output is the same bits over its own T keys and over a cache with masked
    keys after them (a longer neighbour), before them (left padding) or among them (the gap between a shared prefix
    and a prompt's rest), so a sequence decodes alike in any batch. Before its sums were anchored at the first live key, every fp32 case here differed by 1-2 ulps (the
    softmax's tail summed apart); the bf16 scores' tail, reduced apart too, was hidden here by the output's rounding."""
    g = torch.Generator().manual_seed(D + T)
    q = torch.randn(2, 6, 1, D, generator=g).to(dtype)
    k, v = torch.randn(2, 3, T, D, generator=g).to(dtype), torch.randn(2, 3, T, D, generator=g).to(dtype)
    own = cpu_kernels.decode_attention(q, k, v, torch.zeros(2, 1, 1, T), scale=D ** -0.5)
    for before, gap, after in ((0, 0, 11), (5, 0, 0), (3, 0, 30), (17, 0, 2), (0, 6, 3), (2, 13, 0)):
        def pad(x):  # masked keys before, after the first 4 keys (a shared prefix's gap), and after
            rand = lambda n: torch.randn(2, 3, n, D, generator=g).to(dtype)
            return torch.cat([rand(before), x[:, :, :4], rand(gap), x[:, :, 4:], rand(after)], 2)
        mask = torch.full((2, 1, 1, before + gap + T + after), float("-inf"))
        mask[..., before:before + 4] = 0
        mask[..., before + 4 + gap:before + gap + T] = 0
        got = cpu_kernels.decode_attention(q, pad(k), pad(v), mask, scale=D ** -0.5)
        assert torch.equal(got, own), (before, gap, after, (got.float() - own.float()).abs().max())


@pytest.mark.parametrize("dtype,V", [(bf16, 49152), (torch.float32, 1000), (torch.float32, 37)])
def test_token_logprobs_are_the_samplers_log_probs_bit_for_bit(dtype, V):
    """The trainer's exact log-softmax (``core.train.exact``) shares ``sample_rows``' arithmetic: the same bits for
    the drawn tokens, within 1e-5 of torch's log_softmax for any token."""
    g = torch.Generator().manual_seed(V)
    x = (torch.randn(9, V, generator=g) * 3).to(dtype)
    tok, logp = torch.ops.hybridrl_cpu.sample_rows(x, 1 / 0.7, torch.rand(9, generator=g))
    assert torch.equal(torch.ops.hybridrl_cpu.token_logprobs(x, 1 / 0.7, tok), logp)
    other = torch.randint(0, V, (9,), generator=g)
    want = (x.float() / 0.7).log_softmax(-1).gather(-1, other[:, None]).squeeze(-1)
    torch.testing.assert_close(torch.ops.hybridrl_cpu.token_logprobs(x, 1 / 0.7, other), want, atol=1e-5, rtol=0)
