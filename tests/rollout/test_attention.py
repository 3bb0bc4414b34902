"""core.rollout.attention: the decode kernel equals SDPA (GQA, strided cache views, both mask kinds), a padded
full forward through it equals the model's SDPA forward, and inverse-CDF sampling draws the right frequencies."""

import pytest
import torch
import torch.nn.functional as F

from core.rollout.attention import NAME, decode_attention
from core.rollout.sampling import sample_inverse_cdf, sequence_seeds, token_uniforms
from core.models import load_causal_lm


class Module(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


@pytest.mark.parametrize("mask_kind", ["additive", "bool", "none"])
def test_decode_kernel_equals_sdpa_on_strided_cache_views(mask_kind):
    torch.manual_seed(0)
    B, H, KVH, D, T = 5, 6, 2, 16, 11
    cache_k, cache_v = torch.randn(8, KVH, 32, D), torch.randn(8, KVH, 32, D)
    k, v = cache_k[:B, :, :T], cache_v[:B, :, :T]            # views with the cache's strides, as the engine passes
    q = torch.randn(B, H, 1, D)
    allowed = torch.rand(B, 1, 1, T) > 0.3
    allowed[..., -1] = True                                    # every row sees at least its own position
    mask = {"additive": torch.zeros(B, 1, 1, T).masked_fill(~allowed, torch.finfo(torch.float32).min),
            "bool": allowed, "none": None}[mask_kind]
    ours, _ = decode_attention(Module().eval(), q, k, v, mask, scaling=0.3)
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1),
                                         attn_mask=mask, scale=0.3).transpose(1, 2)
    assert ours.shape == (B, 1, H, D)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_a_padded_full_forward_through_it_equals_the_sdpa_forward(tiny_model_dir):
    # transformers builds masks by implementation name: a left-padded batch must be masked under ours too
    model = load_causal_lm(str(tiny_model_dir))
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    attn = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        ref = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
        model.set_attn_implementation(NAME)
        ours = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
    torch.testing.assert_close(ours[attn > 0], ref[attn > 0], atol=1e-5, rtol=1e-5)


def test_inverse_cdf_sampling_draws_the_distribution_and_never_a_zero():
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2]]).repeat(20000, 1)
    u = token_uniforms([0] * 20000, range(20000))      # one sequence's first 20,000 draws
    tok = sample_inverse_cdf(probs, u, block=2)
    freq = torch.bincount(tok, minlength=4).float() / len(tok)
    assert freq[1] == 0
    torch.testing.assert_close(freq, probs[0], atol=0.015, rtol=0)   # 3 sigma of a 20,000-draw frequency is < 0.011
    again = sample_inverse_cdf(probs[:100], token_uniforms([0] * 100, range(100)))
    assert torch.equal(again, tok[:100])                               # seeded: same draws


def test_token_uniforms_are_uniform_and_depend_on_seed_and_index_only():
    seeds = sequence_seeds(5, 4000)
    assert len(set(seeds)) == 4000 and sequence_seeds(5, 10, first=3990) == seeds[3990:]
    u = token_uniforms(seeds * 5, [t for t in range(5) for _ in seeds])  # 5 tokens of 4,000 sequences
    assert u.dtype == torch.float32 and 0 <= float(u.min()) and float(u.max()) < 1
    hist = torch.histc(u, bins=10, min=0, max=1) / len(u)
    torch.testing.assert_close(hist, torch.full((10,), 0.1), atol=0.007, rtol=0)  # 3 sigma of 20,000 draws: 0.0064
    # the same (seed, index) gives the same uniform in any order or batch; a neighbouring one does not
    assert torch.equal(token_uniforms([seeds[7]], [3]), u[3 * 4000 + 7:3 * 4000 + 8])
    assert float(token_uniforms([seeds[7]], [4])) != float(token_uniforms([seeds[7]], [3]))
    lag = torch.corrcoef(torch.stack([u[:-4000], u[4000:]]))[0, 1]  # token t vs t + 1 of each sequence
    assert abs(float(lag)) < 0.03
