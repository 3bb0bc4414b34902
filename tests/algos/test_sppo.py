"""SPPO (verl's recipe form): the batch soft-mean baseline's limits and invariances, and the squared loss's gradient
on a tiny real model."""

import random

import pytest
import torch

from core.algos import ADVANTAGES, POLICY_LOSSES, LossNorm
from core.config import AdvantageConfig, PolicyLossConfig
from core.protocol import Batch
from tests.algos.helpers import outcome_batch

R = [1.0, 0.0, 0.0, 0.5, -1.0, 1.0]


def baseline(scores, beta):
    """A = R - b, so b = R - A (every row of outcome_batch has one valid token)."""
    adv, _ = ADVANTAGES["sppo"](outcome_batch(scores), AdvantageConfig(sppo_beta=beta))
    b = torch.tensor(scores, dtype=torch.float64) - adv[:, 0]
    assert b.max() - b.min() < 1e-9  # one baseline for the whole batch
    return b.mean()


def test_the_soft_mean_goes_to_the_mean_as_beta_goes_to_0_and_to_the_max_as_beta_grows():
    mean, top = sum(R) / len(R), max(R)
    assert baseline(R, 1e-6).item() == pytest.approx(mean, abs=1e-5)
    assert baseline(R, 0.0).item() == pytest.approx(mean, abs=1e-12)        # beta = 0: the plain mean
    # beta -> inf: max + log(k / B) / beta, k = rows at the max (2 of 6 here)
    assert baseline(R, 1e4).item() == pytest.approx(top + torch.log(torch.tensor(2 / 6)).item() / 1e4, abs=1e-9)
    assert baseline(R, 1e4).item() == pytest.approx(top, abs=2e-4)
    soft = [baseline(R, b).item() for b in (0.01, 0.1, 1.0, 10.0, 100.0)]
    assert soft == sorted(soft) and mean < soft[0] < soft[-1] < top          # monotone in beta, between the two
    # beta = 1 by hand: log((e + 1 + 1 + e^0.5 + e^-1 + e) / 6)
    e = torch.e
    assert baseline(R, 1.0).item() == pytest.approx(torch.log(torch.tensor((2 * e + 2 + e ** 0.5 + 1 / e) / 6)).item())


@pytest.mark.parametrize("beta", [0.0, 1.0, 5.0])
def test_the_baseline_is_shift_equivariant_so_advantages_ignore_a_constant(beta):
    shifted = [r + 3.25 for r in R]
    assert baseline(shifted, beta).item() == pytest.approx(baseline(R, beta).item() + 3.25, abs=1e-9)
    a, _ = ADVANTAGES["sppo"](outcome_batch(R), AdvantageConfig(sppo_beta=beta))
    b, _ = ADVANTAGES["sppo"](outcome_batch(shifted), AdvantageConfig(sppo_beta=beta))
    torch.testing.assert_close(a, b)


def test_the_baseline_spans_the_whole_batch_whatever_the_groups():
    """verl's SPPO centres on the batch, not per prompt: relabelling or shuffling uids changes nothing, unlike GRPO."""
    uids = ["a", "a", "b", "b", "c", "c"]
    adv, _ = ADVANTAGES["sppo"](outcome_batch(R, uid=uids), AdvantageConfig())
    for seed in range(3):
        shuffled = uids[:]
        random.Random(seed).shuffle(shuffled)
        other, _ = ADVANTAGES["sppo"](outcome_batch(R, uid=shuffled), AdvantageConfig())
        torch.testing.assert_close(other, adv)
    alone, _ = ADVANTAGES["sppo"](outcome_batch(R, uid=[str(i) for i in range(6)]), AdvantageConfig())
    torch.testing.assert_close(alone, adv)
    grpo, _ = ADVANTAGES["grpo"](outcome_batch(R, uid=uids), AdvantageConfig())
    grpo2, _ = ADVANTAGES["grpo"](outcome_batch(R, uid=["a", "a", "a", "b", "b", "b"]), AdvantageConfig())
    assert not torch.allclose(grpo, grpo2)                                    # the contrast: GRPO's is per group


def model_logprobs(model_dir):
    """The tiny model's log-probs of 3 responses (grad on), their mask, and the model."""
    from core.train.forward import response_logprobs
    from core.models import load_causal_lm
    from tests.train.test_shared_prompt import grouped_batch

    model = load_causal_lm(str(model_dir))
    b = grouped_batch(prompt_lens=[5, 3, 4], response_lens=[4, 2, 3], same_as=[])
    logp, _ = response_logprobs(model, b, remove_padding=False)
    return model, logp, b["response_mask"]


def sppo_loss(logp, old, adv, mask, eta):
    batch = Batch({"old_logprobs": old, "advantages": adv[:, None] * mask, "response_mask": mask})
    loss, _ = POLICY_LOSSES["sppo"](logp, batch, PolicyLossConfig(sppo_eta=eta), LossNorm.of(mask))
    return loss


def test_the_loss_gradient_is_zero_where_the_log_ratio_equals_eta_a(tiny_model_dir):
    model, logp, mask = model_logprobs(tiny_model_dir)
    adv, eta = torch.tensor([0.7, -0.4, 0.1]), 2.0
    old = (logp.detach() - (eta * adv / mask.sum(-1))[:, None]) * mask   # sum_t (logp - old) = eta A per row
    sppo_loss(logp, old, adv, mask, eta).backward()
    assert max(p.grad.abs().max() for p in model.parameters() if p.grad is not None) < 1e-6


def test_the_loss_gradient_at_old_equals_current_is_minus_2_eta_a_grad_log_pi(tiny_model_dir):
    model, logp, mask = model_logprobs(tiny_model_dir)
    adv, eta = torch.tensor([0.7, -0.4, 0.1]), 1.5
    params = [p for p in model.parameters()]
    g_loss = torch.autograd.grad(sppo_loss(logp, logp.detach(), adv, mask, eta), params, retain_graph=True,
                                 allow_unused=True)
    # mean over the B = 3 samples: -2 eta A_i / B times the gradient of sum_t log pi of sample i
    target = (-2 * eta * adv / 3 * (logp * mask).sum(-1)).sum()
    g_ref = torch.autograd.grad(target, params, allow_unused=True)
    pairs = [(a, b) for a, b in zip(g_loss, g_ref) if a is not None]
    assert pairs and max(b.abs().max() for _, b in pairs) > 1e-3
    for a, b in pairs:
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
