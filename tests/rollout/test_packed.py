"""Packed and sibling-fused linears (core.rollout.packed): found groups; oneDNN's format bit-identical to F.linear,
ours (csrc/linear.cpp) within a bf16 rounding of the fp32 product on every row and column remainder, its sums in
vdpbf16ps's order; re-pack on update."""

from collections import Counter

import pytest
import torch

from core.kernels import cpu as cpu_kernels
from core.rollout.packed import PackedLinears, _onednn_usable, can_pack, kernel_usable
from core.config import SamplingParams
from core.rollout.engine import RolloutEngine
from core.models import load_causal_lm, load_tokenizer

needs_bf16 = pytest.mark.skipif(
    not can_pack(torch.nn.Linear(2, 2).to(torch.bfloat16)),
    reason="no packed bf16 linear is chosen on this CPU (AVX2, oneDNN without native bf16): the engine does not pack")


needs_kernel = pytest.mark.skipif(not kernel_usable(exact=True), reason="our CPU kernels are not built here")
needs_onednn = pytest.mark.skipif(not _onednn_usable(), reason="this CPU's oneDNN has no native bf16")
needs_built = pytest.mark.skipif(not cpu_kernels.available(), reason="our CPU kernels are not built here")


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 numbers at |x| (8 significant bits)."""
    return torch.exp2(torch.floor(torch.log2(x.abs().clamp_min(1e-30))) - 7)


@needs_kernel
@pytest.mark.parametrize("rows,k,n,bias", [(1, 64, 16, False), (13, 576, 960, True), (64, 1536, 576, False),
                                           (300, 128, 50, True), (7, 96, 100, False), (9, 2, 33, True)])
def test_our_packed_linear_is_within_a_bf16_rounding_of_the_fp32_product(rows, k, n, bias):
    """Row counts off the 8-row block and the 256-row chunk, widths off the 48-column tile and off 16 (masked
    stores), a 3-D input: each output is the fp32 product rounded to bf16 -- one bf16 step at most, plus the fp32
    noise of a different summation order."""
    g = torch.Generator().manual_seed(rows * 1000 + n)
    x = torch.randn(3, rows, k, generator=g).to(torch.bfloat16)
    w = torch.randn(n, k, generator=g).to(torch.bfloat16)
    b = torch.randn(n, generator=g).to(torch.bfloat16) if bias else None
    y = torch.ops.hybridrl_cpu.linear_packed(x, torch.ops.hybridrl_cpu.pack_linear(w), b, n)
    exact = x.double() @ w.double().T + (b.double() if bias else 0)
    assert y.shape == (3, rows, n) and y.dtype == torch.bfloat16
    noise = 1e-6 * (x.double().abs() @ w.double().abs().T)
    assert ((y.double() - exact).abs() <= bf16_ulp(exact) + noise).all()
    # most outputs are exactly the fp32 product correctly rounded
    assert (y == exact.float().to(torch.bfloat16)).double().mean() > 0.95


@needs_kernel
@pytest.mark.parametrize("rows,k,n", [(1, 64, 16), (13, 96, 100), (9, 32, 48), (20, 10, 17)])
def test_our_bf16_sums_follow_vdpbf16ps_order_and_a_row_is_alone(rows, k, n):
    """Each output: per k pair, the odd then the even product added to an fp32 sum (a bf16 product is exact in
    fp32: each addition is the only rounding), plus the bias, rounded once -- vdpbf16ps's documented order, which
    the path without AVX512-BF16 follows bit for bit; so a row's outputs do not depend on the other rows."""
    g = torch.Generator().manual_seed(rows + k)
    x, w, b = (torch.randn(*shape, generator=g).to(torch.bfloat16) for shape in ((rows, k), (n, k), (n,)))
    y = torch.ops.hybridrl_cpu.linear_packed(x, torch.ops.hybridrl_cpu.pack_linear(w), b, n)
    acc = torch.zeros(rows, n)
    for kp in range(k // 2):
        for i in (2 * kp + 1, 2 * kp):
            acc = acc + x[:, i, None].float() * w[None, :, i].float()
    want = (acc + b.float()).to(torch.bfloat16)
    if cpu_kernels.isa() != "avx512_bf16":  # the native instruction: within a bf16 rounding (the test above)
        assert torch.equal(y, want)
    alone = torch.ops.hybridrl_cpu.linear_packed(x[-1:].clone(), torch.ops.hybridrl_cpu.pack_linear(w), b, n)
    assert torch.equal(alone[0], y[-1])


@pytest.mark.skipif(not kernel_usable(torch.float32), reason="our fp32 packed linear needs AVX2 + FMA")
@pytest.mark.parametrize("rows,k,n,bias", [(1, 64, 16, False), (13, 576, 960, True), (64, 576, 1536, False),
                                           (200, 128, 50, True), (7, 96, 100, False), (5, 3, 33, True)])
def test_our_fp32_packed_linear_is_the_product_to_fp32_accuracy(rows, k, n, bias):
    """Row counts off the 6-row block and the 192-row chunk, widths off the 16-column tile, odd k, a 3-D input:
    within the fp32 noise of a summation order (1e-6 of sum |x w|) of the float64 product; used by an fp32 engine."""
    g = torch.Generator().manual_seed(rows * 1000 + n)
    x, w = torch.randn(3, rows, k, generator=g), torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    y = torch.ops.hybridrl_cpu.linear_packed(x, torch.ops.hybridrl_cpu.pack_linear(w), b, n)
    exact = x.double() @ w.double().T + (b.double() if bias else 0)
    assert y.shape == (3, rows, n) and y.dtype == torch.float32
    assert ((y.double() - exact).abs() <= 1e-6 * (x.double().abs() @ w.double().abs().T + 1)).all()
    assert can_pack(torch.nn.Linear(2, 2))


@needs_kernel
def test_our_packed_linear_refuses_mismatched_shapes():
    with pytest.raises(RuntimeError, match="in_features must be even"):
        torch.ops.hybridrl_cpu.pack_linear(torch.zeros(4, 5, dtype=torch.bfloat16))
    packed = torch.ops.hybridrl_cpu.pack_linear(torch.zeros(20, 8, dtype=torch.bfloat16))  # 20 -> 32 columns
    assert packed.numel() == 32 * 8
    with pytest.raises(RuntimeError, match="has 256 values, expected 512 for \\(20, 16\\)"):
        torch.ops.hybridrl_cpu.linear_packed(torch.zeros(2, 16, dtype=torch.bfloat16), packed, None, 20)
    with pytest.raises(RuntimeError, match="bias has 3 values, expected 20"):
        torch.ops.hybridrl_cpu.linear_packed(torch.zeros(2, 8, dtype=torch.bfloat16), packed,
                                             torch.zeros(3, dtype=torch.bfloat16), 20)


def reference_pack(w: torch.Tensor) -> torch.Tensor:
    """Our packed layout written out in torch (csrc/linear.cpp): rows padded to 16, tiles of 48 (bf16) or 16 (fp32)
    rows, each tile's 32-bit words -- a bf16 (k, k+1) pair or one fp32 -- transposed, as int32 bit patterns."""
    tile = 16 if w.dtype == torch.float32 else 48
    words = w.contiguous().view(torch.int32)
    padded = torch.zeros((w.shape[0] + 15) // 16 * 16, words.shape[1], dtype=torch.int32)
    padded[:w.shape[0]] = words
    return torch.cat([padded[c:c + tile].T.reshape(-1) for c in range(0, padded.shape[0], tile)])


@needs_built
@pytest.mark.parametrize("dtype,k", [(torch.bfloat16, 10), (torch.bfloat16, 34), (torch.bfloat16, 576),
                                     (torch.float32, 7), (torch.float32, 17), (torch.float32, 576)])
def test_packing_rows_in_place_gives_the_layout_of_the_whole_new_weight(dtype, k):
    """A weight sync re-packs each sibling's rows into the existing packed buffer: row offsets off the 8 x 8 blocks
    and across 48- and 16-row tiles, widths with and without whole blocks of 8 words; every bit as the layout of the
    whole new weight (checked against the layout written in torch), padding kept zero."""
    g = torch.Generator().manual_seed(k)
    old, new = (torch.randn(100, k, generator=g).to(dtype) for _ in range(2))
    packed = torch.ops.hybridrl_cpu.pack_linear(old)
    assert torch.equal(packed.view(torch.int32), reference_pack(old))
    row0 = 0
    for rows in (5, 19, 13, 63):
        torch.ops.hybridrl_cpu.pack_linear_into(packed, new[row0:row0 + rows], row0, 100)
        row0 += rows
    assert torch.equal(packed.view(torch.int32), reference_pack(new))
    with pytest.raises(RuntimeError, match="rows 90..110 of 100 x"):
        torch.ops.hybridrl_cpu.pack_linear_into(packed, new[:20], 90, 100)


@needs_built
@pytest.mark.parametrize("dtype,k", [(torch.bfloat16, 10), (torch.bfloat16, 34), (torch.bfloat16, 576),
                                     (torch.float32, 7), (torch.float32, 17), (torch.float32, 576)])
def test_rows_sent_in_fp32_pack_straight_and_unpack_to_the_weight(dtype, k):
    """A sync's rows packed with no parameter in between (``load_linear_rows(packed, None, ...)``): fp32 rows cast on
    the way (the same rounding as torch's cast, NaN as the parameter path gives it), rows of the packed dtype as
    they are; pieces off and on the 16-row lines (the streamed path and the word-by-word one); ``unpack_linear``
    gives back any rows bit for bit."""
    g = torch.Generator().manual_seed(k)
    new = torch.randn(100, k, generator=g)
    new[40, k // 2], new[41, 1] = float("inf"), 1e-40  # a subnormal: kept, as torch's cast keeps it
    for src in (new, new.to(dtype)):
        packed = torch.ops.hybridrl_cpu.pack_linear(torch.zeros(100, k, dtype=dtype))
        row0 = 0
        for rows in (5, 19, 13, 63):
            torch.ops.hybridrl_cpu.load_linear_rows(packed, None, src[row0:row0 + rows], row0, 100)
            row0 += rows
        assert torch.equal(packed.view(torch.int32), reference_pack(new.to(dtype)))
        assert torch.equal(torch.ops.hybridrl_cpu.unpack_linear(packed, 0, 100, 100, k), new.to(dtype))
        assert torch.equal(torch.ops.hybridrl_cpu.unpack_linear(packed, 37, 50, 100, k), new[37:87].to(dtype))
    nan = new.clone()
    nan[3, 1] = float("nan")
    packed, param = torch.ops.hybridrl_cpu.pack_linear(torch.zeros(100, k, dtype=dtype)), torch.empty(100, k, dtype=dtype)
    torch.ops.hybridrl_cpu.load_linear_rows(packed, param, nan, 0, 100)
    straight = torch.zeros_like(packed)
    torch.ops.hybridrl_cpu.load_linear_rows(straight, None, nan, 0, 100)
    assert torch.equal(straight.view(torch.int32), packed.view(torch.int32))
    assert torch.equal(packed.view(torch.int32), reference_pack(param))
    with pytest.raises(RuntimeError, match="rows 90..110 of 100 x"):
        torch.ops.hybridrl_cpu.unpack_linear(packed, 90, 20, 100, k)


@needs_onednn
def test_onednn_packing_is_bit_identical_to_f_linear_and_ours_is_used_by_default(tiny_model_dir):
    model = tiny_bf16(tiny_model_dir)
    x = torch.randn(4, 5, model.config.hidden_size, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    with torch.no_grad():
        want = [m(x) for m in (model.model.layers[0].self_attn.q_proj, model.model.layers[0].mlp.up_proj)]
        packed = PackedLinears(model, lambda: model(input_ids=torch.tensor([[3, 4]])), rows_hint=4, kernel=False)
        assert not any(g.kernel for g in packed.groups)
        got = [m(x) for m in (model.model.layers[0].self_attn.q_proj, model.model.layers[0].mlp.up_proj)]
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    packed.remove()
    if kernel_usable():
        assert all(g.kernel for g in PackedLinears(model, lambda: model(input_ids=torch.tensor([[3]])), 4).groups)


def tiny_bf16(tiny_model_dir):
    return load_causal_lm(str(tiny_model_dir), dtype=torch.bfloat16)


@needs_bf16
def test_calibration_fuses_qkv_and_gate_up_and_leaves_the_rest_alone(tiny_model_dir):
    model = tiny_bf16(tiny_model_dir)
    packed = PackedLinears(model, lambda: model(input_ids=torch.tensor([[3, 4]])), rows_hint=4)
    names = {id(m): n.rsplit(".", 1)[-1] for n, m in model.named_modules()}
    groups = sorted(tuple(names[id(m)] for m in g.modules) for g in packed.groups)
    L = model.config.num_hidden_layers
    expected = sorted([("q_proj", "k_proj", "v_proj")] * L + [("gate_proj", "up_proj")] * L
                      + [("o_proj",)] * L + [("down_proj",)] * L + [("lm_head",)])
    assert groups == expected
    packed.remove()
    assert all("forward" not in vars(m) for m in model.modules())


@needs_bf16
def test_packed_engine_matches_the_plain_one_in_bf16(tiny_model_dir):
    """Bit for bit here (the tiny model's short sums round alike in either order); oneDNN's format is bit-identical
    by construction, ours up to fp32 summation order (the test above)."""
    tok = load_tokenizer(str(tiny_model_dir))
    plain = RolloutEngine(tiny_bf16(tiny_model_dir), tok, max_batch_size=4, pack_weights=False)
    packed = RolloutEngine(tiny_bf16(tiny_model_dir), tok, max_batch_size=4)
    assert plain.packed is None and packed.packed is not None and packed.packed.nbytes > 0
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in ["hi", "a longer prompt", "xyz 1"]]
    for params in (SamplingParams(temperature=0, max_new_tokens=10),
                   SamplingParams(n=3, temperature=0.8, max_new_tokens=10, seed=3)):
        a, b = plain.generate(ids, params), packed.generate(ids, params)
        assert torch.equal(a["responses"], b["responses"])
        assert torch.equal(a["rollout_logprobs"], b["rollout_logprobs"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_weight_update_repacks_what_it_touched(tiny_model_dir, dtype):
    """After a whole sync and after a one-tensor update (k_proj alone, in the middle of a fused q/k/v group) every
    packed weight in our format is, bit for bit, a fresh pack of the module weights; generation equals an unpacked
    engine's (in oneDNN's format too: without our kernels, where the engine packs bf16 in it)."""
    model = load_causal_lm(str(tiny_model_dir), dtype=dtype)
    if not can_pack(model):
        pytest.skip(f"the engine does not pack {dtype} weights on this CPU")
    tok = load_tokenizer(str(tiny_model_dir))
    engine = RolloutEngine(model, tok, max_batch_size=4)
    reference = RolloutEngine(load_causal_lm(str(tiny_model_dir), dtype=dtype), tok, max_batch_size=4,
                              pack_weights=False)
    g = torch.Generator().manual_seed(0)
    fresh = {n: torch.randn(p.shape, generator=g) * 0.2 for n, p in engine.model.named_parameters()}
    k_proj = "model.layers.0.self_attn.k_proj.weight"
    for update in (fresh, {k_proj: fresh[k_proj] * -2}):
        engine.update_weights(update.items())
        reference.update_weights(update.items())
        for group in engine.packed.groups:  # ours; oneDNN's opaque format is checked by the generation below
            if group.kernel:
                want = torch.ops.hybridrl_cpu.pack_linear(torch.cat([m.weight for m in group.modules]))
                assert torch.equal(group.weight, want)
        ids = [tok("hello there", add_special_tokens=False)["input_ids"]]
        params = SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True)
        a, b = engine.generate(ids, params), reference.generate(ids, params)
        # an engine packed afresh from the same weights: bit for bit (a stale pack anywhere would show here)
        fresh_engine = RolloutEngine(load_causal_lm(str(tiny_model_dir), dtype=dtype), tok, max_batch_size=4)
        fresh_engine.update_weights((n, p.detach().clone()) for n, p in reference.model.named_parameters())
        assert torch.equal(a["rollout_logprobs"], fresh_engine.generate(ids, params)["rollout_logprobs"])
        # the unpacked engine: the same tokens; log-probs to rounding, since our kernels sum in another order than
        # MKL's fp32 and, on CPUs with AMX, oneDNN's bf16 tiles (1.9e-6 seen on a Xeon with amx_bf16; bit-equal in
        # bf16 on AVX512-BF16 without AMX)
        assert torch.equal(a["responses"], b["responses"])
        torch.testing.assert_close(a["rollout_logprobs"], b["rollout_logprobs"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_single_copy_engine_keeps_each_linear_once_and_syncs_the_same(tiny_model_dir, dtype):
    """``single_copy=True`` (the rollout worker's engine): every linear weight in our format lives only in its packed
    rows -- its parameter is a meta tensor of its shape, a weight tied to another module stays -- and after a whole
    sync and a one-tensor update the packed rows, the unpacked weights and the generation are bit for bit those of
    an engine that keeps both copies; ``verify_weights`` reads the unpacked values; ``remove`` gives them back."""
    model = load_causal_lm(str(tiny_model_dir), dtype=dtype)
    if not can_pack(model) or not kernel_usable(dtype):
        pytest.skip(f"our packed format does not run {dtype} on this CPU")
    tok = load_tokenizer(str(tiny_model_dir))
    one = RolloutEngine(model, tok, max_batch_size=4, single_copy=True)
    two = RolloutEngine(load_causal_lm(str(tiny_model_dir), dtype=dtype), tok, max_batch_size=4)
    shared = Counter(id(p) for m in model.modules() for p in m._parameters.values() if p is not None)
    linears = {f"{n}.weight" for n, m in model.named_modules() if type(m) is torch.nn.Linear and shared[id(m.weight)] == 1}
    assert linears and {n for n, p in one.params.items() if p.is_meta} == linears
    assert not any(p.is_meta for n, p in one.params.items() if n not in linears)
    g = torch.Generator().manual_seed(0)
    fresh = {n: torch.randn(p.shape, generator=g) * 0.2 for n, p in two.params.items()}
    k_proj = "model.layers.0.self_attn.k_proj.weight"
    ids = [tok("hello there", add_special_tokens=False)["input_ids"]]
    params = SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True)
    for update in (fresh, {k_proj: fresh[k_proj] * -2}):
        for engine in (one, two):
            engine.update_weights(update.items())
        assert all(torch.equal(a.weight, b.weight) for a, b in zip(one.packed.groups, two.packed.groups))
        mine, theirs = one.weights(), two.weights()
        assert all(torch.equal(mine[n], theirs[n]) for n in theirs)
        one.verify_weights(update.items())
        a, b = one.generate(ids, params), two.generate(ids, params)
        assert torch.equal(a["responses"], b["responses"]) and torch.equal(a["rollout_logprobs"], b["rollout_logprobs"])
    with pytest.raises(ValueError, match=f"checksum mismatch on {k_proj}"):
        one.verify_weights([(k_proj, fresh[k_proj])])
    with pytest.raises(RuntimeError, match="was released"):
        one.packed.refresh([one.params[k_proj]])
    one.packed.remove()
    assert all(torch.equal(p, theirs[n]) for n, p in model.named_parameters())


class TwoReadsAndAnInPlaceEdit(torch.nn.Module):
    """a(x) and b(x) read one tensor -- but x changes in place between them: b must see the new x."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 16), torch.nn.Linear(32, 8, bias=False)

    def forward(self, x):
        x = x.clone()
        ya = self.a(x)
        x.mul_(2)
        return ya, self.b(x)


@needs_bf16
def test_a_sibling_called_after_its_input_changed_in_place_computes_again():
    torch.manual_seed(0)
    m = TwoReadsAndAnInPlaceEdit().to(torch.bfloat16)
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        want = m(x)
        packed = PackedLinears(m, lambda: m(x), rows_hint=4)
        assert [len(g.modules) for g in packed.groups] == [2]  # grouped by calibration: same input object
        got = m(x)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch build")
def test_fp32_without_our_kernel_packs_in_onednns_format(tiny_model_dir):
    """kernel=False (or no kernels built) on fp32 weights: oneDNN's packed format, not ours (asked for ours, a
    build without the kernels would have failed on its missing ops), within fp32 noise of F.linear."""
    model = load_causal_lm(str(tiny_model_dir), dtype=torch.float32)
    x = torch.randn(4, 5, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    q = model.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        want = q(x)
        packed = PackedLinears(model, lambda: model(input_ids=torch.tensor([[3, 4]])), rows_hint=4, kernel=False)
        assert packed.groups and not any(g.kernel for g in packed.groups)
        torch.testing.assert_close(q(x), want, atol=1e-5, rtol=1e-5)
    packed.remove()
