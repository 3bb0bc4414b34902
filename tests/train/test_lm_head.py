"""The LM head fused into the log-softmax (core.train.lm_head): the textbook values and gradients (fp32, several
vocabulary blocks, several targets per position, temperature, entropy), bf16 within its rounding, and a model's log-probs,
entropies and every parameter's gradient equal to the standard path's, with and without shared prompts. The block
work runs on the CPU kernels (csrc/lm_head.cpp) where they are built and on PyTorch ops otherwise: the unit tests
take each path (``blocks``)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import core.train.lm_head as lm_head
from core.kernels import cpu as cpu_kernels
from core.train.forward import response_logprobs
from core.train.lm_head import HeadLogprobs, fused_head
from core.models import load_causal_lm
from tests.train.test_shared_prompt import UNEVEN, grouped_batch


def textbook(hidden, weight, pos, ids, T):
    x = (hidden @ weight.T).float()[pos] / T
    logp = torch.log_softmax(x, -1).gather(-1, ids[:, None])[:, 0]
    ent = -(x.softmax(-1) * torch.log_softmax(x, -1)).sum(-1)
    return logp, ent


@pytest.fixture(params=["torch", "kernels"])
def blocks(request, monkeypatch):
    """Which code does the per-block work: PyTorch ops, or the fused CPU kernels (counted: each block's call)."""
    calls = {"fold": 0, "grad": 0, "blocks": 0 if request.param == "torch" else 5}
    if request.param == "torch":
        monkeypatch.setattr(lm_head, "_on_kernels", lambda hidden: False)
        return calls
    if not cpu_kernels.available():
        pytest.skip("the CPU kernels are not built here (HYBRIDRL_CPU_KERNELS=0 or no compiler)")
    fold, grad = torch.ops.hybridrl_cpu.head_fold, torch.ops.hybridrl_cpu.head_grad

    def counted(name, fn):
        def call(*args):
            calls[name] += 1
            return fn(*args)
        return call

    monkeypatch.setattr(lm_head, "_fold", counted("fold", fold))
    monkeypatch.setattr(lm_head, "_grad", counted("grad", grad))
    return calls


def case(dtype, M=10, D=6, V=23, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(M, D, generator=g) * 2).to(dtype).requires_grad_(True)
    weight = torch.randn(V, D, generator=g).to(dtype).requires_grad_(True)
    # positions 0 and 7 carry three and two targets; position 4 none (its logits never matter)
    pos = torch.tensor([0, 0, 0, 1, 2, 3, 5, 6, 7, 7, 8, 9])
    ids = torch.randint(0, V, (len(pos),), generator=g)
    return hidden, weight, pos, ids, torch.randn(len(pos), generator=g), torch.randn(len(pos), generator=g)


class CountMatmuls(TorchDispatchMode):
    """Counts the matrix products run inside it (the head's block projections and its two gradient products)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in (torch.ops.aten.mm.default, torch.ops.aten.mm.out, torch.ops.aten.addmm.default)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("keep", [False, True], ids=["recompute", "keep"])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_fused_head_gives_the_textbook_logprobs_entropy_and_gradients_in_fp32(with_entropy, keep, blocks, monkeypatch):
    """``keep``: the forward keeps its blocks' logits for backward (a training forward) instead of backward
    projecting them again: the same values, and 5 block products fewer (5 + 2 instead of 5 + 5 + 2)."""
    monkeypatch.setattr(lm_head, "BLOCK_VALUES", 10 * 5)  # blocks of 5 vocabulary rows: 5 blocks, the last of 3
    hidden, weight, pos, ids, w_logp, w_ent = case(torch.float32)
    with CountMatmuls() as products:
        logp, ent = HeadLogprobs.apply(hidden, weight, pos, ids, 0.7, with_entropy, keep)
        got = torch.autograd.grad((logp * w_logp).sum() + ((ent * w_ent).sum() if with_entropy else 0),
                                  (hidden, weight))
    assert products.count == (7 if keep else 12)
    want_logp, want_ent = textbook(hidden, weight, pos, ids, 0.7)
    torch.testing.assert_close(logp, want_logp, atol=1e-5, rtol=1e-5)
    if with_entropy:
        torch.testing.assert_close(ent, want_ent, atol=1e-5, rtol=1e-5)
    want = torch.autograd.grad((want_logp * w_logp).sum() + ((want_ent * w_ent).sum() if with_entropy else 0),
                               (hidden, weight))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert got[0][4].abs().max() == 0  # a position with no target gets no gradient
    assert blocks["fold"] == blocks["grad"] == blocks["blocks"]  # the kernels took each of the 5 blocks, both ways


def test_fused_head_in_bf16_is_within_the_rounding_of_the_standard_path(blocks, monkeypatch):
    """bf16 logits normalised in fp32 on either path: the same log-probs up to the fp32 summation order; the
    gradients within bf16 rounding (each one matmul over the bf16 gradient of the logits, as autograd's). Kept
    logits (a training forward) and recomputed ones give the same bits."""
    monkeypatch.setattr(lm_head, "BLOCK_VALUES", 10 * 5)
    hidden, weight, pos, ids, w_logp, _ = case(torch.bfloat16, seed=1)
    want, _ = textbook(hidden, weight, pos, ids, 1.0)
    ref = torch.autograd.grad((want * w_logp).sum(), (hidden, weight))
    results = []
    for keep in (False, True):
        logp, _ = HeadLogprobs.apply(hidden, weight, pos, ids, 1.0, False, keep)
        torch.testing.assert_close(logp, want, atol=1e-5, rtol=1e-5)
        got = torch.autograd.grad((logp * w_logp).sum(), (hidden, weight))
        for a, b in zip(got, ref):  # bit-identical here; one bf16 step allowed for the softmax's summation order
            assert a.dtype == torch.bfloat16
            torch.testing.assert_close(a.float(), b.float(), atol=0, rtol=2 ** -7)
        results.append((logp, *got))
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize("share", [False, True])
def test_a_model_gives_the_standard_paths_logprobs_entropy_and_gradients(tiny_model_dir, share, monkeypatch):
    model = load_causal_lm(str(tiny_model_dir))
    assert fused_head(model) is model.lm_head  # a Llama: fused
    b = grouped_batch(**UNEVEN)
    mask = b["response_mask"]
    results, types = [], lm_head.FUSED_MODEL_TYPES
    kept_blocks, used = lm_head._kept_blocks, []
    monkeypatch.setattr(lm_head, "_kept_blocks", lambda *a: used.append(1) or kept_blocks(*a))
    for fused in (False, True):
        monkeypatch.setattr(lm_head, "FUSED_MODEL_TYPES", types if fused else set())
        assert (fused_head(model) is not None) == fused
        model.zero_grad()
        logp, ent = response_logprobs(model, b, 0.9, with_entropy=True, share_prompt=share)
        (logp * mask * torch.arange(1.0, 8.0)[:, None]).sum().add((ent * mask).sum()).backward()
        results.append((logp.detach() * mask, ent.detach() * mask, [p.grad.clone() for p in model.parameters()]))
    assert used == [1]  # a training forward's backward took the logits its forward kept
    (lp0, e0, g0), (lp1, e1, g1) = results
    assert lp0.abs().max() > 1
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(e1, e0, atol=1e-5, rtol=1e-5)
    for a, c in zip(g1, g0):
        torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-4)
    assert "forward" not in vars(model.lm_head)  # the head's own forward is back


def test_a_model_whose_forward_transforms_the_logits_keeps_the_standard_path(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir))
    model.config.model_type = "gemma2"  # soft-caps its logits after the head
    assert fused_head(model) is None
