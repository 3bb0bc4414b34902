"""KL kinds, KL controllers, KL reward penalty, and the DAPO / PF-PPO filters, by hand."""

import math

import pytest
import torch

from core.algos import (KL_KINDS, AdaptiveKLController, FixedKLController, apply_kl_reward_penalty,
                        groups_with_variance, overlong_penalty, pf_ppo_resample)
from core.protocol import Batch

LP, REF = torch.tensor([-1.0]), torch.tensor([-2.0])


@pytest.mark.parametrize("kind,value", [("k1", 1.0), ("kl", 1.0), ("abs", 1.0), ("k2", 0.5), ("mse", 0.5),
                                        ("k3", math.exp(-1)), ("low_var_kl", math.exp(-1))])
def test_kl_values(kind, value):
    assert KL_KINDS[kind](LP, REF).item() == pytest.approx(value, abs=1e-6)


def test_abs_is_symmetric_and_k3_is_clamped():
    assert KL_KINDS["abs"](REF, LP).item() == 1.0
    assert KL_KINDS["k3"](torch.tensor([-30.0]), torch.tensor([0.0])).item() == 10.0  # exp(20) - 21 -> 10


@pytest.mark.parametrize("kind", ["k1", "abs", "k2", "k3", "low_var_kl", "mse"])
def test_straight_through_variants_keep_the_value_and_take_the_k2_gradient(kind):
    lp = torch.tensor([-1.0, -0.2, -3.0], requires_grad=True)
    ref = torch.tensor([-2.0, -0.5, -1.0])
    value = KL_KINDS[f"{kind}+"](lp, ref)
    torch.testing.assert_close(value.detach(), KL_KINDS[kind](lp.detach(), ref))
    value.sum().backward()
    torch.testing.assert_close(lp.grad, (lp - ref).detach())  # d/dlp of 0.5 (lp - ref)^2


def test_adaptive_controller():
    ctl = AdaptiveKLController(value=0.1, target=0.1, horizon=640)
    ctl.update(current_kl=0.2, n_steps=64)  # error clipped to +0.2 -> * (1 + 0.2 * 0.1)
    assert ctl.value == pytest.approx(0.102)
    ctl.update(current_kl=0.09, n_steps=64)  # error -0.1 -> * 0.99
    assert ctl.value == pytest.approx(0.102 * 0.99)
    fixed = FixedKLController(0.05)
    fixed.update(9.0, 64)
    assert fixed.value == 0.05 and fixed.state_dict() == {"value": 0.05}


def test_kl_reward_penalty():
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    b = Batch({"token_rewards": torch.tensor([[0.0, 1.0], [2.0, 0.0]]), "old_logprobs": torch.tensor([[-1.0, -1.0], [-1.0, -9.0]]),
               "ref_logprobs": torch.tensor([[-2.0, -1.5], [-1.0, 0.0]]), "response_mask": mask})
    ctl = FixedKLController(0.1)
    rewards, m = apply_kl_reward_penalty(b, ctl, "k1")
    torch.testing.assert_close(rewards, torch.tensor([[-0.1, 0.95], [2.0, 0.0]]))
    assert m["actor/reward_kl_penalty"] == pytest.approx((0.75 + 0.0) / 2)
    assert m["actor/reward_kl_penalty_coeff"] == 0.1


def test_dynamic_sampling_keeps_groups_with_variance():
    keep = groups_with_variance(["a", "a", "b", "b", "c"], torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0]))
    assert keep.tolist() == [True, True, False, False, True]


def test_overlong_penalty():
    out = overlong_penalty(torch.tensor([10, 16, 18, 20, 25]), max_len=20, buffer=4, penalty=1.0)
    assert out.tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]


def test_pf_ppo_resampling():
    b = Batch({"scores": torch.tensor([0.0, 0.5, 1.0])}, {"uid": ["a", "b", "c"]})
    g = torch.Generator().manual_seed(0)
    out = pf_ppo_resample(b, "max_min", generator=g)
    assert len(out) == 3 and "b" not in out["uid"].tolist()
    big = Batch({"scores": torch.tensor([0.0] * 50 + [1.0] * 50)})
    drawn = pf_ppo_resample(big, "pow", generator=g)["scores"]
    assert drawn.mean().item() > 0.99  # |0|^2 = 0: zero-score samples are (almost) never drawn
    mr = pf_ppo_resample(big, "max_random", generator=torch.Generator().manual_seed(1))["scores"]
    assert 0.65 < mr.mean().item() < 0.95  # expected 0.4 / (0.4 + 0.1) = 0.8
    with pytest.raises(ValueError, match="PF-PPO method"):
        pf_ppo_resample(b, "best")


def test_kl_as_a_loss_is_aggregated_and_differentiable():
    from core.algos import LossNorm, kl_loss

    lp = torch.tensor([[-1.0, -3.0, -7.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    b = Batch({"ref_logprobs": torch.tensor([[-2.0, -2.0, 0.0]]), "response_mask": mask})
    loss = kl_loss(lp, b, "k2", LossNorm.of(mask))
    assert loss.item() == pytest.approx(0.5)  # (0.5 * 1 + 0.5 * 1) / 2 valid tokens
    loss.backward()
    assert lp.grad.tolist() == [[0.5, -0.5, 0.0]]
