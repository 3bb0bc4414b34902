"""Every advantage estimator against values computed by hand (the same numbers as its docstring example)."""

import math

import pytest
import torch

from core.config import AdvantageConfig
from core.algos import ADVANTAGES, gae_scan, reverse_linear_scan
from core.protocol import Batch
from tests.algos.helpers import mask_of, outcome_batch

C = AdvantageConfig()
close = lambda a, b: torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), atol=1e-4, rtol=0)


def two_token_batch() -> Batch:
    """r = [[0, 1]], V = [[0.5, 0.25]]: the docstring examples of the GAE family."""
    return Batch({"token_rewards": torch.tensor([[0.0, 1.0]], dtype=torch.float64),
                  "values": torch.tensor([[0.5, 0.25]], dtype=torch.float64),
                  "response_mask": torch.ones(1, 2, dtype=torch.float64)})


def test_gae_hand_computed():
    adv, ret = ADVANTAGES["gae"](two_token_batch(), AdvantageConfig(gamma=1.0, lam=1.0))
    close(ret, [[1.0, 1.0]])
    close(adv, [[-0.7071, 0.7071]])


def test_gae_scan_with_discount_and_padding():
    # gamma = 0.5, lam = 0.5, one valid token then padding: A_0 = r_0 - V_0 (nothing after the last valid token)
    raw = gae_scan(torch.tensor([[2.0, 9.0]]), torch.tensor([[0.5, 7.0]]), torch.tensor([[1.0, 0.0]]), 0.5, 0.5)
    assert raw[0, 0].item() == pytest.approx(1.5)
    # two valid tokens: delta_1 = 1 - 0.5 = 0.5; delta_0 = 0 + 0.5*0.5 - 1 = -0.75; A_0 = -0.75 + 0.25*0.5
    raw = gae_scan(torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 0.5]]), torch.ones(1, 2), 0.5, 0.5)
    close(raw, [[-0.625, 0.5]])


def test_gae_skips_masked_observation_tokens():
    # a masked token in the middle (tool output) passes value and advantage through
    r, v = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 123.0, 0.25]])
    with_gap = gae_scan(r, v, torch.tensor([[1.0, 0.0, 1.0]]), 1.0, 1.0)
    without = gae_scan(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.25]]), torch.ones(1, 2), 1.0, 1.0)
    close(with_gap[:, [0, 2]], without)


def reference_gapped_gae(r, v, mask, gamma, lam):
    """A plain loop over one row: GAE over the model's tokens only, as if the masked (tool-output) tokens were cut
    out -- the next value and advantage are those of the next *valid* token; masked positions get 0 here."""
    adv, next_v, next_a = [0.0] * len(r), 0.0, 0.0
    for t in reversed(range(len(r))):
        if mask[t] == 0:
            continue
        delta = r[t] + gamma * next_v - v[t]
        next_a = delta + gamma * lam * next_a
        adv[t], next_v = next_a, v[t]
    return adv


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_over_gapped_masks_equals_a_reference_loop(gamma, lam):
    """Multi-turn responses: random masks with gaps (tool output), leading / trailing padding, rewards on
    several tokens; the vectorised scan equals the loop on every valid token."""
    g = torch.Generator().manual_seed(0)
    B, T = 16, 24
    mask = (torch.rand(B, T, generator=g) > 0.35).double()
    mask[0] = 0.0
    mask[0, 5] = 1.0  # a single valid token
    r, v = torch.randn(B, T, generator=g, dtype=torch.float64), torch.randn(B, T, generator=g, dtype=torch.float64)
    got = gae_scan(r, v, mask, gamma, lam)
    want = torch.tensor([reference_gapped_gae(r[b].tolist(), v[b].tolist(), mask[b].tolist(), gamma, lam)
                         for b in range(B)], dtype=torch.float64)
    close(got * mask, want)


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus_returns_pass_through_tool_tokens(gamma):
    """A tool-output gap inside the response does not reset the return-to-go (it did: G_t = r_t + gamma m_{t+1}
    G_{t+1} zeroed the first turn's return); the valid tokens' returns equal those of the gap cut out."""
    r = torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    _, ret = ADVANTAGES["reinforce_plus_plus"](Batch({"token_rewards": r, "response_mask": mask}), C.__class__(gamma=gamma))
    _, cut = ADVANTAGES["reinforce_plus_plus"](Batch({"token_rewards": r[:, [0, 3]], "response_mask": torch.ones(1, 2, dtype=torch.float64)}),
                                               C.__class__(gamma=gamma))
    close(ret[:, [0, 3]], cut)
    close(cut, [[gamma, 1.0]])


def test_decoupled_gae():
    adv, ret = ADVANTAGES["decoupled_gae"](two_token_batch(), AdvantageConfig(lam=0.0, lam_critic=1.0))
    close(ret, [[1.0, 1.0]])
    close(adv, [[-0.7071, 0.7071]])


def test_length_adaptive_gae_uses_per_sequence_lambda():
    T = 200
    mask = mask_of([40, 200], T)
    rewards = torch.zeros(2, T, dtype=torch.float64)
    rewards[0, 39], rewards[1, 199] = 1.0, 1.0
    values = torch.zeros(2, T, dtype=torch.float64)
    b = Batch({"token_rewards": rewards, "values": values, "response_mask": mask})
    cfg = AdvantageConfig(length_alpha=0.05)
    _, ret = ADVANTAGES["length_adaptive_gae"](b, cfg)
    close(ret[0, :40], torch.ones(40))  # lam_critic = 1: undecayed value targets
    raw0 = gae_scan(rewards, values, mask, 1.0, torch.tensor([0.5, 0.9], dtype=torch.float64))
    # with V = 0, A_t = lam^(L-1-t): first token of each sequence
    assert raw0[0, 0].item() == pytest.approx(0.5 ** 39) and raw0[1, 0].item() == pytest.approx(0.9 ** 199)
    adv, _ = ADVANTAGES["length_adaptive_gae"](b, cfg)
    ref = (raw0 - (raw0 * mask).sum() / mask.sum())
    var = ((ref * mask) ** 2).sum() / (mask.sum() - 1)
    close(adv, ref / torch.sqrt(var + 1e-8) * mask)


def reference_gae(rewards, values, lengths, gamma, lams):
    """GAE by the textbook loop, one response at a time over its valid tokens: delta_t = r_t + gamma V_{t+1} - V_t
    (V after the last token = 0), A_t = delta_t + gamma lam A_{t+1}."""
    out = torch.zeros_like(rewards)
    for i, (L, lam) in enumerate(zip(lengths, lams)):
        nxt_a = 0.0
        for t in reversed(range(L)):
            nxt_v = float(values[i, t + 1]) if t + 1 < L else 0.0
            delta = float(rewards[i, t]) + gamma * nxt_v - float(values[i, t])
            nxt_a = delta + gamma * lam * nxt_a
            out[i, t] = nxt_a
    return out


def test_length_adaptive_lambda_by_hand_and_clamped_for_short_responses():
    from core.algos import length_adaptive_lambda

    close(length_adaptive_lambda(mask_of([10, 20, 40, 200]), 0.05), [0.0, 0.0, 0.5, 0.9])  # 1 - 1/(0.05 l), >= 0


def test_per_row_lambda_gae_equals_the_reference_loop():
    g = torch.Generator().manual_seed(0)
    lengths, T = [3, 7, 25, 40], 40
    mask = mask_of(lengths, T)
    rewards = torch.randn(4, T, generator=g, dtype=torch.float64) * mask
    values = torch.randn(4, T, generator=g, dtype=torch.float64) * mask
    b = Batch({"token_rewards": rewards, "values": values, "response_mask": mask})
    cfg = AdvantageConfig(gamma=0.99, length_alpha=0.05, lam_critic=1.0)
    lams = [0.0, 0.0, 0.2, 0.5]                                     # 1 - 1/(0.05 l), clamped at 0
    raw = gae_scan(rewards, values, mask, cfg.gamma, torch.tensor(lams, dtype=torch.float64))
    close(raw * mask, reference_gae(rewards, values, lengths, cfg.gamma, lams))
    adv, ret = ADVANTAGES["length_adaptive_gae"](b, cfg)
    close(ret, (reference_gae(rewards, values, lengths, cfg.gamma, [1.0] * 4) + values) * mask)  # lam_critic = 1
    ref = reference_gae(rewards, values, lengths, cfg.gamma, lams)
    mean = (ref * mask).sum() / mask.sum()
    std = torch.sqrt((((ref - mean) * mask) ** 2).sum() / (mask.sum() - 1) + 1e-8)
    close(adv, (ref - mean) / std * mask)                           # whitened over the batch's valid tokens


def test_lambda_critic_one_returns_are_the_reward_to_go_whatever_the_values():
    g = torch.Generator().manual_seed(1)
    lengths, T = [1, 5, 9], 9
    mask = mask_of(lengths, T)
    rewards = torch.randn(3, T, generator=g, dtype=torch.float64) * mask
    to_go = rewards.flip(-1).cumsum(-1).flip(-1) * mask             # sum_{k >= t} r_k (gamma = 1)
    for scale in (0.0, 1.0, 100.0):
        values = torch.randn(3, T, generator=g, dtype=torch.float64) * scale * mask
        b = Batch({"token_rewards": rewards, "values": values, "response_mask": mask})
        _, ret = ADVANTAGES["length_adaptive_gae"](b, AdvantageConfig(gamma=1.0, lam_critic=1.0, length_alpha=0.05))
        close(ret, to_go)


def test_grpo_and_dr_grpo():
    b = outcome_batch([1, 0, 0, 5], uid=["a", "a", "a", "lone"])
    adv, ret = ADVANTAGES["grpo"](b, C)
    close(adv[:, 0], [2 / 3 / (0.57735 + 1e-6), -1 / 3 / (0.57735 + 1e-6), -1 / 3 / (0.57735 + 1e-6), 5.0])
    assert adv[0, 0].item() == pytest.approx(1.1547, abs=1e-4)
    assert torch.equal(adv, ret)
    dr, _ = ADVANTAGES["grpo"](b, AdvantageConfig(norm_by_std=False))
    close(dr[:, 0], [2 / 3, -1 / 3, -1 / 3, 5.0])


def test_grpo_broadcasts_over_valid_tokens_only():
    b = outcome_batch([1, 0], uid=["a", "a"], lengths=[3, 1])
    adv, _ = ADVANTAGES["grpo"](b, C)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    close(adv, [[a, a, a], [-a, 0, 0]])


def test_rloo():
    adv, _ = ADVANTAGES["rloo"](outcome_batch([1, 0, 0, 0.3], uid=["a", "a", "a", "b"]), C)
    close(adv[:, 0], [1.0, -0.5, -0.5, 0.3])


def test_reinforce_plus_plus():
    b = Batch({"token_rewards": torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=torch.float64),
               "response_mask": torch.ones(2, 2, dtype=torch.float64)})
    adv, ret = ADVANTAGES["reinforce_plus_plus"](b, C)
    close(ret, [[1, 1], [0, 0]])
    close(adv, [[0.8660, 0.8660], [-0.8660, -0.8660]])
    _, ret = ADVANTAGES["reinforce_plus_plus"](b, AdvantageConfig(gamma=0.5))
    close(ret, [[0.5, 1], [0, 0]])


def test_reinforce_plus_plus_baseline():
    adv, _ = ADVANTAGES["reinforce_plus_plus_baseline"](outcome_batch([1, 0, 1, 1], uid=["a", "a", "b", "b"]), C)
    close(adv[:, 0], [1.2247, -1.2247, 0, 0])


def test_remax():
    b = Batch({"token_rewards": torch.tensor([[0.0, 1.0]], dtype=torch.float64),
               "response_mask": torch.ones(1, 2, dtype=torch.float64),
               "reward_baselines": torch.tensor([0.25], dtype=torch.float64)})
    adv, ret = ADVANTAGES["remax"](b, C)
    close(ret, [[1, 1]])
    close(adv, [[0.75, 0.75]])


def test_opo_length_weighted_baseline():
    adv, _ = ADVANTAGES["opo"](outcome_batch([1, 0, 0.7], uid=["a", "a", "b"], lengths=[1, 3, 2]), C)
    close(adv[:, 0], [0.75, -0.25, 0.7])


def test_gpg():
    adv, _ = ADVANTAGES["gpg"](outcome_batch([1, 0, 0, 0], uid=["a"] * 4), C)
    close(adv[:, 0], [3, -1, -1, -1])


def test_grpo_passk():
    adv, _ = ADVANTAGES["grpo_passk"](outcome_batch([0, 1, 0, 1, 1], uid=["a", "a", "a", "b", "b"]), C)
    close(adv[:, 0], [0, 1 / (0.57735 + 1e-6), 0, 0, 0])  # group b: best - second = 0
    with pytest.raises(ValueError, match="uid='z'"):
        ADVANTAGES["grpo_passk"](outcome_batch([1, 1, 0], uid=["a", "a", "z"]), C)


def test_sppo_softmean_baseline():
    adv, _ = ADVANTAGES["sppo"](outcome_batch([1, 0]), C)
    close(adv[:, 0], [1 - math.log((math.e + 1) / 2), -math.log((math.e + 1) / 2)])
    assert adv[0, 0].item() == pytest.approx(0.3799, abs=1e-4)
    plain, _ = ADVANTAGES["sppo"](outcome_batch([1, 0]), AdvantageConfig(sppo_beta=0.0))
    close(plain[:, 0], [0.5, -0.5])


@pytest.mark.parametrize("name", sorted(set(ADVANTAGES.names()) - {"remax"}))
def test_outputs_vanish_on_masked_tokens(name):
    b = outcome_batch([1, 0, 0.5, 1], uid=["a", "a", "b", "b"], lengths=[3, 1, 2, 3],
                      values=torch.rand(4, 3, generator=torch.Generator().manual_seed(0)),
                      process_rewards=torch.rand(4, 3, generator=torch.Generator().manual_seed(1)),  # prime's
                      # distillation's: NaN past each row's end (a padded position need not be finite)
                      old_logprobs=-torch.rand(4, 3, generator=torch.Generator().manual_seed(2)),
                      teacher_logprobs=-torch.rand(4, 3, generator=torch.Generator().manual_seed(3)))
    b["old_logprobs"] = b["old_logprobs"].masked_fill(b["response_mask"] == 0, float("nan"))
    adv, ret = ADVANTAGES[name](b, C)
    assert adv.shape == ret.shape == (4, 3)
    assert torch.all(adv[b["response_mask"] == 0] == 0) and torch.all(ret[b["response_mask"] == 0] == 0)


def test_unknown_estimator_lists_the_known_ones():
    with pytest.raises(KeyError, match="unknown advantage estimator 'grpoo'; known: .*'grpo'"):
        ADVANTAGES["grpoo"]


def test_reverse_linear_scan_matches_a_plain_loop():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 7, generator=g, dtype=torch.float64), torch.rand(3, 7, generator=g, dtype=torch.float64)
    y, nxt = torch.zeros_like(a), torch.zeros(3, dtype=torch.float64)
    for t in range(6, -1, -1):
        nxt = a[:, t] + b[:, t] * nxt
        y[:, t] = nxt
    close(reverse_linear_scan(a, b), y)


def test_gae_scan_matches_a_reference_loop_on_random_masks_with_gaps():
    g = torch.Generator().manual_seed(1)
    B, T = 5, 9
    r, v = torch.randn(B, T, generator=g, dtype=torch.float64), torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) > 0.3).double()
    gamma, lam = 0.9, torch.tensor([0.5, 0.7, 0.9, 0.95, 1.0], dtype=torch.float64)
    adv, next_v, last = torch.zeros(B, T, dtype=torch.float64), torch.zeros(B, dtype=torch.float64), torch.zeros(B, dtype=torch.float64)
    for t in range(T - 1, -1, -1):  # verl's loop, observation tokens skipped
        m = mask[:, t]
        delta = r[:, t] + gamma * next_v - v[:, t]
        last = m * (delta + gamma * lam * last) + (1 - m) * last
        next_v = m * v[:, t] + (1 - m) * next_v
        adv[:, t] = last
    close(gae_scan(r, v, mask, gamma, lam), adv)


def _gapped_batch() -> Batch:
    """Tool output inside responses (mask 1 1 0 0 1 ...), a leading masked token, and values / process rewards that
    are not zero on the masked tokens."""
    mask = torch.tensor([[1, 1, 0, 0, 1], [1, 0, 1, 1, 0], [1, 1, 1, 0, 0], [0, 1, 0, 1, 1]], dtype=torch.float64)
    r = torch.zeros(4, 5, dtype=torch.float64)
    r[0, 1], r[0, 4], r[1, 2], r[1, 3], r[3, 4] = 0.3, 1.0, -0.2, 0.5, 1.0
    g = torch.Generator().manual_seed(0)
    return Batch({"token_rewards": r, "response_mask": mask, "values": torch.rand(4, 5, generator=g, dtype=torch.float64),
                  "process_rewards": torch.rand(4, 5, generator=g, dtype=torch.float64),
                  "old_logprobs": -torch.rand(4, 5, generator=g, dtype=torch.float64),  # distillation's
                  "teacher_logprobs": -torch.rand(4, 5, generator=g, dtype=torch.float64),
                  "reward_baselines": torch.tensor([0.25, 0.5, 0.0, 1.0], dtype=torch.float64)},
                 {"uid": ["a", "a", "b", "b"]})


def _cut_gaps(b: Batch) -> Batch:
    """The same rows with their masked tokens cut out (valid tokens moved left, padding after)."""
    keep = b["response_mask"] > 0
    out = {}
    for k in ("token_rewards", "response_mask", "values", "process_rewards", "old_logprobs", "teacher_logprobs"):
        x = torch.zeros_like(b[k])
        for i in range(len(x)):
            x[i, :int(keep[i].sum())] = b[k][i][keep[i]]
        out[k] = x
    return Batch({**out, "reward_baselines": b["reward_baselines"]}, {"uid": b["uid"]})


# prime's return G_t = R_t + gamma G_{t+1} also decays on masked tokens (the others skip them), so with gamma < 1 its
# valid tokens differ from the gaps-cut-out response's: left as it is (verl's prime has no gamma: a plain cumsum)
DECAYS_ACROSS_GAPS = {"prime"}


@pytest.mark.parametrize("gamma", [1.0, 0.9])
@pytest.mark.parametrize("name", ADVANTAGES.names())
def test_every_estimator_is_zero_inside_a_gapped_mask_and_unchanged_on_valid_tokens(name, gamma):
    """Advantages and returns are exactly 0 on every masked token, also mid-response (reinforce_plus_plus and remax
    left the return passed through a gap there; prime decayed it by gamma per masked token). On the valid tokens they are what they were: those of the response
    with its gaps cut out (returns and GAE skip a gap; checked bitwise against the code before this fix)."""
    cfg = AdvantageConfig(gamma=gamma, lam=0.95)
    b = _gapped_batch()
    adv, ret = ADVANTAGES[name](b, cfg)
    off = b["response_mask"] == 0
    assert torch.all(adv[off] == 0) and torch.all(ret[off] == 0), (adv, ret)
    cut = _cut_gaps(b)
    adv_cut, ret_cut = ADVANTAGES[name](cut, cfg)
    on = cut["response_mask"] > 0
    torch.testing.assert_close(adv[~off], adv_cut[on], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ret[~off], ret_cut[on], rtol=1e-12, atol=1e-12)
