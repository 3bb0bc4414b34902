"""The fused bf16 training attention (``csrc/train_attention.cpp`` through ``train_attention.FusedAttention``):
values and gradients as close to the fp32 attention of the same bf16 inputs as PyTorch's bf16 SDPA is, masked keys
exactly inert, a query that sees no key finite, and a bf16 model on it gives SDPA's log-probs and gradients.
Only where the kernels are built with AVX512-BF16 (elsewhere the matmul / SDPA paths run: test_train_attention.py)."""

import pytest
import torch
import torch.nn.functional as F

from core.kernels import cpu as cpu_kernels

pytestmark = pytest.mark.skipif(cpu_kernels.isa() != "avx512_bf16",
                                reason="the fused training attention is built for AVX512-BF16 only")


def fused(q, k, v, mask, scale):
    from core.train.train_attention import FusedAttention

    visible = mask[:, 0].contiguous().view(torch.uint8) if mask is not None else torch.empty(0, dtype=torch.uint8)
    return FusedAttention.apply(q, k, v, visible, scale)


def sdpa(q, k, v, mask, scale):  # (B, q, H, D) as the fused kernel returns
    if mask is None:  # causal over the last q of the T positions (SDPA's is_causal aligns to the first)
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril(k.shape[2] - q.shape[2])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True).transpose(1, 2)


def inputs(B, H, KVH, q, T, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, h, n, D, generator=g).bfloat16() for h, n in ((H, q), (KVH, T), (KVH, T))]


def values_and_grads(fn, q, k, v, mask, scale, weight, dtype):
    leaves = [x.to(dtype).requires_grad_(True) for x in (q, k, v)]
    out = fn(*leaves, mask, scale)
    grads = torch.autograd.grad((out.float() * weight).sum(), leaves)
    return [out.detach().float()] + [g.float() for g in grads]


@pytest.mark.parametrize("shape", [(3, 6, 2, 7, 12, 32), (2, 9, 3, 40, 70, 64), (2, 4, 4, 17, 17, 128)])
@pytest.mark.parametrize("masked", [False, True])
def test_fused_attention_is_as_close_to_fp32_as_sdpa_in_bf16(shape, masked):
    B, H, KVH, q_len, T, D = shape
    q, k, v = inputs(B, H, KVH, q_len, T, D)
    mask = None
    if masked:  # causal from the last q_len positions, and row 0 with three left-padding keys
        mask = torch.ones(q_len, T, dtype=torch.bool).tril(T - q_len)[None, None].repeat(B, 1, 1, 1)
        mask[0, :, :, :3] = False
    scale = D ** -0.5
    weight = torch.randn(B, q_len, H, D, generator=torch.Generator().manual_seed(1))
    exact = values_and_grads(sdpa, q, k, v, mask, scale, weight, torch.float32)
    ours = values_and_grads(fused, q, k, v, mask, scale, weight, torch.bfloat16)
    theirs = values_and_grads(sdpa, q, k, v, mask, scale, weight, torch.bfloat16)
    for name, e, o, t in zip(("out", "dq", "dk", "dv"), exact, ours, theirs):
        err, sdpa_err = (o - e).abs().mean(), (t - e).abs().mean()
        assert err <= 1.3 * sdpa_err, (name, float(err), float(sdpa_err))
        assert (o - e).abs().max() <= 0.02 * e.abs().max() + 1e-2, name


def test_masked_keys_weigh_nothing_and_get_no_gradient():
    B, H, KVH, q_len, T, D = 2, 4, 2, 9, 15, 64
    q, k, v = inputs(B, H, KVH, q_len, T, D, seed=3)
    mask = torch.ones(B, 1, q_len, T, dtype=torch.bool)
    mask[:, :, :, 4:7] = False                     # keys 4-6 seen by no query
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out = fused(*leaves, mask, 0.125)
    _, dk, dv = torch.autograd.grad(out.float().sum(), leaves)
    assert dk[:, :, 4:7].abs().sum() == 0 and dv[:, :, 4:7].abs().sum() == 0
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 4:7], v2[:, :, 4:7] = 30.0, -30.0      # whatever they hold
    assert torch.equal(fused(q, k2, v2, mask, 0.125), out.detach())


def test_a_query_that_sees_no_key_gives_zero_and_finite_gradients():
    q, k, v = inputs(1, 2, 1, 5, 5, 32, seed=4)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()[None, None].clone()
    mask[0, 0, 0] = False                           # query 0 sees nothing
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out = fused(*leaves, mask, 32 ** -0.5)
    grads = torch.autograd.grad(out.float().sum(), leaves)
    assert out[:, 0].abs().sum() == 0 and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("share", [False, True])
def test_a_bf16_model_on_the_fused_attention_gives_sdpas_logprobs_and_gradients(tmp_path, share, monkeypatch):
    """Head size 32 (hidden 128, 4 heads, 2 KV heads): every layer's attention goes through the fused kernel --
    by parts with shared prompts -- and the log-probs and gradients agree with SDPA's bf16 ones."""
    import core.train.train_attention as train_attention
    from core.train.forward import response_logprobs
    from core.models import load_causal_lm, tiny_random_model
    from tests.train.test_shared_prompt import UNEVEN, grouped_batch

    calls = []
    apply = train_attention.FusedAttention.apply
    monkeypatch.setattr(train_attention.FusedAttention, "apply", lambda *a: calls.append(1) or apply(*a))
    model = load_causal_lm(str(tiny_random_model(tmp_path / "m", hidden=128)), dtype=torch.bfloat16)
    b = grouped_batch(**UNEVEN)
    mask = b["response_mask"]
    results = []
    for impl in ("sdpa", train_attention.NAME):
        model.set_attn_implementation(impl)
        model.zero_grad()
        logp, _ = response_logprobs(model, b, share_prompt=share)
        (logp * mask).sum().backward()
        results.append((logp.detach() * mask, [p.grad.float().clone() for p in model.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0], atol=2e-2, rtol=2e-2)
    for a, c in zip(results[1][1], results[0][1]):
        assert (a - c).norm() <= 0.05 * c.norm() + 1e-4
    assert len(calls) == model.config.num_hidden_layers * (2 if share else 1)
