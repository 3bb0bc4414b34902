"""Packed and sibling-fused linears (core.engines.packed): found groups, bit-identical outputs, re-pack on update."""

import pytest
import torch

from core.engines.packed import PackedLinears, can_pack
from core.engines.rollout import RolloutEngine, SamplingParams
from core.models import load_causal_lm, load_tokenizer

needs_bf16 = pytest.mark.skipif(
    not can_pack(torch.nn.Linear(2, 2).to(torch.bfloat16)),
    reason="this CPU's oneDNN has no native bf16 (no avx512_bf16 / AMX): the engine does not pack here")


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
def test_packed_engine_is_bit_identical_to_the_plain_one_in_bf16(tiny_model_dir):
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


@needs_bf16
def test_a_weight_update_repacks_what_it_touched(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    engine = RolloutEngine(tiny_bf16(tiny_model_dir), tok, max_batch_size=4)
    fresh = {n: torch.randn_like(p) * 0.2 for n, p in engine.model.named_parameters()}
    engine.update_weights(fresh.items())
    reference = RolloutEngine(tiny_bf16(tiny_model_dir), tok, max_batch_size=4, pack_weights=False)
    reference.update_weights(fresh.items())
    ids = [tok("hello there", add_special_tokens=False)["input_ids"]]
    params = SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True)
    a, b = engine.generate(ids, params), reference.generate(ids, params)
    assert torch.equal(a["responses"], b["responses"]) and torch.equal(a["rollout_logprobs"], b["rollout_logprobs"])


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
