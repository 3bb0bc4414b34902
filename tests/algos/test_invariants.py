"""Invariants every policy loss must keep, checked on random batches for all registry entries.

- zero advantages -> zero gradient;
- ratio 1 and no clipping -> the plain policy-gradient gradient of agg(-A logp)
  (these two: not for the implicit PRM's loss, which reads labels, not advantages: ``REWARD_MODEL_LOSSES``);
- masked tokens change nothing (loss, gradient of valid tokens) and get zero gradient;
- splitting a mini-batch into micro-batches, and into 2 simulated data-parallel ranks (gradients averaged),
  leaves loss and gradient unchanged, for every aggregation mode.
"""

import pytest
import torch

from core.config import PolicyLossConfig
from core.algos import AGGREGATIONS, POLICY_LOSSES, LossNorm
from core.algos.losses import REWARD_MODEL_LOSSES
from core.protocol import Batch

LOSSES = POLICY_LOSSES.names()
POLICY_GRADIENT = sorted(set(LOSSES) - REWARD_MODEL_LOSSES)
MODES = AGGREGATIONS.names()
# the aggregation an objective fixes for itself, whatever the configured mode (see their docstrings)
OWN_MODE = {"gspo": "seq-mean-token-mean", "geo_mean": "seq-mean-token-mean", "sppo": "seq-mean-token-sum",
            "sapo": "seq-mean-token-mean"}
# these two pick tokens by covariance within the batch they are given, so a micro-batch split changes which
# tokens are picked: invariance to the split does not hold by design (Cui et al. 2025 select per batch)
BATCH_DEPENDENT = {"clip_cov", "kl_cov"}
# a clip window no random token reaches, so clip_cov's random cut is off where a test needs plain PPO
CFG = PolicyLossConfig(clip_cov_lb=1e6, clip_cov_ub=1e7, dro_beta=0.05)


def data(seed=0, B=8, T=6, seq_adv=False):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    old = logp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, 1 if seq_adv else T, generator=g, dtype=torch.float64).expand(B, T).contiguous()
    return logp, old, adv, mask


def loss_and_grad(name, logp, old, adv, mask, norm, cfg=CFG, rows=None):
    leaf = logp.clone().requires_grad_(True)
    parts = rows or [slice(None)]
    total = 0
    for r in parts:
        # ref_logprobs and labels in [0, 1] (from the first token's advantage, never masked) for the implicit PRM
        b = Batch({"old_logprobs": old[r], "advantages": adv[r], "response_mask": mask[r], "ref_logprobs": old[r],
                   "scores": (adv[r][:, 0] > 0).to(adv.dtype)})
        total = total + POLICY_LOSSES[name](leaf[r], b, cfg, norm)[0]
    total.backward()
    return total.detach(), leaf.grad


@pytest.mark.parametrize("name", POLICY_GRADIENT)
def test_zero_advantage_gives_zero_gradient(name):
    logp, old, adv, mask = data(1)
    if name in ("kl_cov", "sppo", "dro"):
        # kl_cov's KL term, sppo's regression onto eta*A and dro's quadratic penalty pull the policy back to pi_old
        # even when A = 0; their policy-gradient part vanishes, which shows at ratio 1
        old = logp.clone()
    _, grad = loss_and_grad(name, logp, old, torch.zeros_like(adv), mask, LossNorm.of(mask))
    assert torch.count_nonzero(grad) == 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", POLICY_GRADIENT)
def test_ratio_one_gives_the_plain_policy_gradient(name, mode):
    logp, _, adv, mask = data(2, seq_adv=True)
    _, grad = loss_and_grad(name, logp, logp.clone(), adv, mask, LossNorm.of(mask, mode))
    ref_mode = OWN_MODE.get(name, mode)
    leaf = logp.clone().requires_grad_(True)
    AGGREGATIONS[ref_mode](-adv * leaf, mask, LossNorm.of(mask, ref_mode)).backward()
    expected = leaf.grad * (2 * CFG.sppo_eta if name == "sppo" else 1.0)  # d/ds (s - eta A)^2 at s = 0
    torch.testing.assert_close(grad, expected, rtol=1e-7, atol=1e-12)  # geo_mean: verl's len + 1e-8


@pytest.mark.parametrize("name", LOSSES)
def test_masked_tokens_contribute_nothing(name):
    logp, old, adv, mask = data(3)
    loss, grad = loss_and_grad(name, logp, old, adv, mask, LossNorm.of(mask))
    junk = torch.full_like(logp, 7.0) * (1 - mask)
    loss2, grad2 = loss_and_grad(name, logp - junk, old + junk, adv + 100 * junk, mask, LossNorm.of(mask))
    torch.testing.assert_close(loss2, loss)
    torch.testing.assert_close(grad2 * mask, grad * mask)
    assert torch.count_nonzero(grad2 * (1 - mask)) == 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(set(LOSSES) - BATCH_DEPENDENT))
def test_micro_batch_and_dp_split_leave_loss_and_gradient_unchanged(name, mode):
    logp, old, adv, mask = data(4, B=8)
    full_loss, full_grad = loss_and_grad(name, logp, old, adv, mask, LossNorm.of(mask, mode))
    # 3 uneven micro-batches, one rank
    micro = [slice(0, 3), slice(3, 4), slice(4, 8)]
    loss, grad = loss_and_grad(name, logp, old, adv, mask, LossNorm.of(mask, mode), rows=micro)
    torch.testing.assert_close(loss, full_loss)
    torch.testing.assert_close(grad, full_grad)
    # 2 DP ranks of 4 rows, 2 micro-batches each; DP averages the ranks' gradients (hence / 2)
    dp_norm = LossNorm.of(mask, mode, dp_size=2)
    ranks = [[slice(0, 1), slice(1, 4)], [slice(4, 6), slice(6, 8)]]
    per_rank = [loss_and_grad(name, logp, old, adv, mask, dp_norm, rows=r) for r in ranks]
    torch.testing.assert_close(sum(l for l, _ in per_rank) / 2, full_loss)
    torch.testing.assert_close(sum(g for _, g in per_rank) / 2, full_grad)


def test_the_split_exemptions_are_only_the_batch_dependent_losses():
    assert BATCH_DEPENDENT <= set(LOSSES) and len(BATCH_DEPENDENT) == 2


@pytest.mark.parametrize("mode", MODES)
def test_per_micro_batch_normalisation_would_break_invariance(mode):
    """The same split normalised per micro-batch (what a naive loop does) gives a different loss: the test
    above can fail."""
    logp, old, adv, mask = data(5, B=8)
    full, _ = loss_and_grad("vanilla", logp, old, adv, mask, LossNorm.of(mask, mode))
    naive = sum(loss_and_grad("vanilla", logp[r], old[r], adv[r], mask[r], LossNorm.of(mask[r], mode))[0]
                for r in [slice(0, 3), slice(3, 8)])
    assert not torch.isclose(naive, full)
