"""PRIME's math by hand: the implicit PRM's loss (value and gradient), the ``prime`` estimator's leave-one-out
baselines and returns, and the PRM's ranking accuracy -- the numbers of their docstring examples, and the
properties that make them what they claim (a sample's baseline never uses its own reward)."""

import math

import pytest
import torch

from core.algos import ADVANTAGES, POLICY_LOSSES, LossNorm
from core.algos.advantages import _leave_one_out
from core.algos.ops import group_ids
from core.config import AdvantageConfig, PolicyLossConfig
from core.implicit_prm import ranking_accuracy
from core.protocol import Batch


def prm_loss(logp, ref, labels, beta=0.5, mask=None):
    logp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    mask = torch.ones_like(logp) if mask is None else torch.tensor(mask, dtype=torch.float64)
    b = Batch({"ref_logprobs": torch.tensor(ref, dtype=torch.float64), "response_mask": mask,
               "scores": torch.tensor(labels, dtype=torch.float64)})
    loss, metrics = POLICY_LOSSES["implicit_prm"](logp, b, PolicyLossConfig(prm_beta=beta), LossNorm.of(mask))
    loss.backward()
    return loss, logp.grad, metrics


def test_implicit_prm_loss_worked_example():
    # z = 0.5 * ((-1 + 2) + (-2 + 2)) = 0.5; y = 1: softplus(0.5) - 0.5; y = 0: softplus(0.5)
    loss, grad, m = prm_loss([[-1.0, -2.0]], [[-2.0, -2.0]], [1.0])
    assert float(loss) == pytest.approx(math.log1p(math.exp(0.5)) - 0.5, abs=1e-12) and float(loss) == pytest.approx(0.4741, abs=1e-4)
    sig = 1 / (1 + math.exp(-0.5))
    torch.testing.assert_close(grad, torch.full((1, 2), 0.5 * (sig - 1.0), dtype=torch.float64))  # -0.1888 each
    assert float(m["implicit_reward_mean"]) == 0.5 and float(m["prm_acc"]) == 1.0
    loss0, grad0, m0 = prm_loss([[-1.0, -2.0]], [[-2.0, -2.0]], [0.0])
    assert float(loss0) == pytest.approx(0.9741, abs=1e-4) and float(m0["prm_acc"]) == 0.0
    assert torch.all(grad0 > 0)  # a wrong answer pushes its tokens' probability under the PRM down


def test_implicit_prm_loss_is_a_mean_over_sequences_and_ignores_masked_tokens():
    # two rows: the second's masked token may hold anything
    loss, grad, _ = prm_loss([[-1.0, -2.0], [-3.0, 9.0]], [[-2.0, -2.0], [-3.5, -50.0]], [1.0, 0.0],
                             mask=[[1, 1], [1, 0]])
    z = torch.tensor([0.5, 0.25], dtype=torch.float64)
    expected = (torch.nn.functional.softplus(z) - torch.tensor([1.0, 0.0], dtype=torch.float64) * z).mean()
    assert float(loss) == pytest.approx(float(expected), abs=1e-12)
    assert grad[1, 1] == 0


def test_implicit_prm_loss_refuses_labels_outside_zero_one():
    with pytest.raises(ValueError, match=r"outcome labels \(scores\) must be in \[0, 1\], got -1 .. 1"):
        prm_loss([[-1.0], [-1.0]], [[-1.0], [-1.0]], [1.0, -1.0])


def test_prime_advantage_worked_example():
    b = Batch({"process_rewards": torch.tensor([[0.2, 0.4], [0.0, 0.2]], dtype=torch.float64),
               "token_rewards": torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=torch.float64),
               "response_mask": torch.ones(2, 2, dtype=torch.float64)}, {"uid": ["a", "a"]})
    adv, ret = ADVANTAGES["prime"](b, AdvantageConfig(prime_process_coef=1.0, prime_outcome_coef=1.0))
    torch.testing.assert_close(ret, torch.tensor([[1.4, 1.4], [-1.4, -1.0]], dtype=torch.float64))
    # whitened: mean 0.1, unbiased var 6.84 / 3
    expected = (torch.tensor([[1.4, 1.4], [-1.4, -1.0]], dtype=torch.float64) - 0.1) / math.sqrt(6.84 / 3 + 1e-8)
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(adv, torch.tensor([[0.8609, 0.8609], [-0.9934, -0.7285]], dtype=torch.float64),
                               atol=1e-4, rtol=0)


def test_the_outcome_baseline_is_exactly_leave_one_out_and_never_the_samples_own():
    # one token per sample, groups of 3 and 2: LOO(r)_i = r_i - mean_{j != i} r_j
    r = torch.tensor([[1.0], [0.0], [0.5], [2.0], [4.0]], dtype=torch.float64)
    gid = group_ids(["a", "a", "a", "b", "b"])
    out = _leave_one_out(r, torch.ones_like(r), gid)
    torch.testing.assert_close(out[:, 0], torch.tensor([1 - 0.25, 0 - 0.75, 0.5 - 0.5, 2 - 4, 4 - 2],
                                                       dtype=torch.float64))
    # raising sample 0's reward by 1 moves its own output by exactly 1 (its baseline leaves it out) and the others'
    # by -1 / (n - 1) (it is in their baselines)
    r2 = r.clone()
    r2[0] += 1.0
    delta = _leave_one_out(r2, torch.ones_like(r), gid) - out
    torch.testing.assert_close(delta[:, 0], torch.tensor([1.0, -0.5, -0.5, 0, 0], dtype=torch.float64))


def test_a_group_of_one_keeps_its_rewards_and_masked_tokens_get_nothing():
    r = torch.tensor([[0.3, 0.7, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(_leave_one_out(r, mask, group_ids(["x"])), r * mask)


def test_prime_returns_are_the_reward_to_go_of_the_weighted_sum():
    g = torch.Generator().manual_seed(0)
    proc = torch.rand(4, 3, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.float64)
    outcome = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    last = torch.zeros_like(mask)
    last[torch.arange(4), mask.sum(-1).long() - 1] = 1
    b = Batch({"process_rewards": proc, "token_rewards": outcome[:, None] * last, "response_mask": mask},
              {"uid": ["a", "a", "b", "b"]})
    cfg = AdvantageConfig(prime_process_coef=2.0, prime_outcome_coef=3.0)
    _, ret = ADVANTAGES["prime"](b, cfg)
    gid = group_ids(["a", "a", "b", "b"])
    total = 2.0 * _leave_one_out(proc, mask, gid) + 3.0 * _leave_one_out(outcome[:, None] * last, last, gid)
    by_hand = torch.stack([torch.stack([(total[i, t:] * mask[i, t:]).sum() for t in range(3)]) for i in range(4)])
    torch.testing.assert_close(ret, by_hand * mask)


def test_ranking_accuracy_worked_example_and_no_pairs():
    gid = group_ids(["g", "g", "g"])
    acc = ranking_accuracy(torch.tensor([2.0, 1.0, 0.0]), torch.tensor([1.0, 0.0, 1.0]), gid)
    assert acc == 0.5
    # pairs across groups never count; all-equal labels give no pairs
    assert ranking_accuracy(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.0]), group_ids(["a", "b"])) is None
    assert ranking_accuracy(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0]), group_ids(["a", "a"])) is None
    # |dy|-weighted: a 0.1 label against 1.0 counts 0.9
    acc = ranking_accuracy(torch.tensor([1.0, 0.0, 2.0]), torch.tensor([1.0, 0.1, 0.0]), gid)
    assert acc == pytest.approx((0.9 * 1 + 1.0 * 0 + 0.1 * 0) / (0.9 + 1.0 + 0.1))
