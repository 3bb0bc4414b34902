"""On-policy distillation's estimators (core.algos.distill) by hand: the per-token gap between the teacher's and
the student's log-probs of the student's own tokens, its forward-KL and mixed forms, the outcome mix; and that each
is the policy gradient of the divergence it names (the expectation over the student's tokens, computed exactly over
a small vocabulary)."""

import math

import pytest
import torch

from core.algos import ADVANTAGES, DISTILL_ESTIMATORS
from core.algos.distill import distill_metrics
from core.config import AdvantageConfig
from core.protocol import Batch

OLD, TEACHER = [[-1.0, -0.5, -3.0]], [[-0.2, -2.0, -0.1]]


def batch(mask=(1.0, 1.0, 0.0), **extra) -> Batch:
    return Batch({"old_logprobs": torch.tensor(OLD, dtype=torch.float64),
                  "teacher_logprobs": torch.tensor(TEACHER, dtype=torch.float64),
                  "response_mask": torch.tensor([mask], dtype=torch.float64), **extra}, {"uid": ["g"]})


def test_reverse_kl_is_teacher_minus_student_on_each_valid_token():
    adv, ret = ADVANTAGES["distill_reverse_kl"](batch(), AdvantageConfig())
    assert adv[0].tolist() == pytest.approx([0.8, -1.5, 0.0])  # -0.2 - (-1.0); -2.0 - (-0.5); past the end: 0
    assert torch.equal(adv, ret)


def test_forward_kl_is_the_capped_importance_weight_minus_one():
    adv, _ = ADVANTAGES["distill_forward_kl"](batch(), AdvantageConfig())
    assert adv[0].tolist() == pytest.approx([math.exp(0.8) - 1, math.exp(-1.5) - 1, 0.0])
    assert adv[0, 0].item() == pytest.approx(1.2255, abs=1e-4) and adv[0, 1].item() == pytest.approx(-0.7769, abs=1e-4)
    capped, _ = ADVANTAGES["distill_forward_kl"](batch(), AdvantageConfig(distill_ratio_cap=2.0))
    assert capped[0, 0].item() == pytest.approx(1.0)  # exp(0.8) = 2.2255 > 2: the weight stops at the cap


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_mixed_interpolates_between_forward_and_reverse(beta):
    cfg = AdvantageConfig(distill_beta=beta)
    mixed, _ = ADVANTAGES["distill_mixed"](batch(), cfg)
    rev, _ = ADVANTAGES["distill_reverse_kl"](batch(), cfg)
    fwd, _ = ADVANTAGES["distill_forward_kl"](batch(), cfg)
    assert torch.allclose(mixed, beta * rev + (1 - beta) * fwd)
    if beta == 0.5:
        assert mixed[0, :2].tolist() == pytest.approx([1.0128, -1.1384], abs=1e-4)


def test_the_outcome_mix_adds_grpos_advantage():
    """Two samples of one prompt, right and wrong: GRPO gives +-0.7071 on every valid token; with coef 0.5 the
    teacher's gap gets half of it added."""
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    b = Batch({"old_logprobs": torch.tensor(OLD * 2, dtype=torch.float64),
               "teacher_logprobs": torch.tensor(TEACHER * 2, dtype=torch.float64),
               "response_mask": torch.tensor([[1.0, 1.0, 0.0]] * 2, dtype=torch.float64), "token_rewards": rewards},
              {"uid": ["g", "g"]})
    adv, _ = ADVANTAGES["distill_reverse_kl"](b, AdvantageConfig(distill_outcome_coef=0.5))
    g = 1 / (math.sqrt(0.5) + 1e-6)  # (1 - 0.5) / std([1, 0]) = 0.7071...
    assert adv[0].tolist() == pytest.approx([0.8 + 0.5 * g * 0.5, -1.5 + 0.5 * g * 0.5, 0.0])
    assert adv[1].tolist() == pytest.approx([0.8 - 0.5 * g * 0.5, -1.5 - 0.5 * g * 0.5, 0.0])


def test_each_estimator_is_the_gradient_of_its_divergence_over_a_small_vocabulary():
    """At one state, student softmax(z) over 4 tokens and a fixed teacher: E_{y ~ pi_S}[A(y) d log pi_S(y) / dz]
    (exact, summed over the vocabulary) equals -d KL(pi_S || pi_T)/dz for the reverse estimator, and
    -d KL(pi_T || pi_S)/dz for the forward one (no cap reached)."""
    z = torch.tensor([0.3, -0.2, 1.0, 0.1], dtype=torch.float64, requires_grad=True)
    log_t = torch.log_softmax(torch.tensor([1.2, 0.0, 0.4, -0.5], dtype=torch.float64), -1)
    log_s = torch.log_softmax(z, -1)
    for name, divergence in (("distill_reverse_kl", (log_s.exp() * (log_s - log_t)).sum()),
                             ("distill_forward_kl", (log_t.exp() * (log_t - log_s)).sum())):
        true_grad, = torch.autograd.grad(divergence, z, retain_graph=True)
        pg = torch.zeros(4, dtype=torch.float64)
        for y in range(4):
            b = Batch({"old_logprobs": log_s[y].detach().reshape(1, 1), "teacher_logprobs": log_t[y].reshape(1, 1),
                       "response_mask": torch.ones(1, 1, dtype=torch.float64)}, {"uid": ["g"]})
            a = ADVANTAGES[name](b, AdvantageConfig(distill_ratio_cap=100.0))[0][0, 0]
            score, = torch.autograd.grad(log_s[y], z, retain_graph=True)
            pg += log_s[y].exp().detach() * a * score
        assert torch.allclose(pg, -true_grad, atol=1e-12), name


def test_every_distill_estimator_is_registered_with_its_math():
    assert DISTILL_ESTIMATORS <= set(ADVANTAGES.names())
    for name in DISTILL_ESTIMATORS:
        doc = ADVANTAGES[name].__doc__
        assert "arXiv:2306.13649" in doc and "Example" in doc


def test_metrics_are_the_sampled_reverse_kl_and_the_teachers_log_prob():
    m = distill_metrics(batch())
    assert m["distill/reverse_kl"] == pytest.approx((-0.8 + 1.5) / 2)
    assert m["distill/teacher_logprob_mean"] == pytest.approx((-0.2 - 2.0) / 2)
    assert distill_metrics(Batch({"response_mask": torch.ones(1, 1)})) == {}
