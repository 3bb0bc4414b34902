"""Off-policy corrections (core/algos/off_policy.py): each entry's worked example by hand, the bounds inclusive, padding
weighted 0, and the step's advantages scaled by the configured entry."""

import math

import pytest
import torch

from core.algos import OFF_POLICY


def test_tis_is_the_ratio_capped_and_zero_on_padding():
    old, rollout = torch.tensor([[-1.0, -2.0, -3.0]]), torch.tensor([[-1.5, -1.0, -3.0]])
    w = OFF_POLICY["tis"](old, rollout, torch.tensor([[1, 1, 0]]), 1.5)
    torch.testing.assert_close(w, torch.tensor([[1.5, math.exp(-1.0), 0.0]]))
    with pytest.raises(ValueError, match="cap must be > 0"):
        OFF_POLICY["tis"](old, rollout, torch.tensor([[1, 1, 0]]), 0.0)


def test_masked_is_keeps_the_ratio_inside_the_band_and_masks_outside():
    old, rollout = torch.tensor([[-1.0, -2.0, -1.0, 0.0]]), torch.tensor([[-1.5, -1.0, -1.1, 9.0]])
    w = OFF_POLICY["masked_is"](old, rollout, torch.tensor([[1, 1, 1, 0]]), 2.0)
    torch.testing.assert_close(w, torch.tensor([[math.exp(0.5), 0.0, math.exp(0.1), 0.0]]))
    # the band's edges are inside: r = 2 and r = 1/2 keep their weight
    edge = OFF_POLICY["masked_is"](torch.log(torch.tensor([[2.0, 0.5]])), torch.zeros(1, 2), torch.ones(1, 2), 2.0)
    torch.testing.assert_close(edge, torch.tensor([[2.0, 0.5]]))


def test_seq_mask_drops_a_whole_sequence_by_its_geometric_mean_ratio():
    old = torch.tensor([[-1.0, -1.0, 0.0], [-1.0, -1.0, 0.0]])
    rollout = torch.tensor([[-1.5, -0.7, 5.0], [-2.0, -2.0, 5.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])  # padding at 5.0 must not enter the mean
    w = OFF_POLICY["seq_mask"](old, rollout, mask, 2.0)
    torch.testing.assert_close(w, torch.tensor([[math.exp(0.5), math.exp(-0.3), 0.0], [0.0, 0.0, 0.0]]))


def test_one_token_far_off_masks_that_token_with_masked_is_and_only_moves_the_mean_with_seq_mask():
    old, rollout = torch.zeros(1, 4), torch.tensor([[0.0, 0.0, 0.0, -2.0]])  # r = [1, 1, 1, e^2]
    mask = torch.ones(1, 4)
    assert OFF_POLICY["masked_is"](old, rollout, mask, 2.0).tolist() == [[1.0, 1.0, 1.0, 0.0]]
    # mean log r = 0.5, e^0.5 = 1.65 inside [1/2, 2]: the sequence stays, each token with its ratio
    torch.testing.assert_close(OFF_POLICY["seq_mask"](old, rollout, mask, 2.0),
                               torch.tensor([[1.0, 1.0, 1.0, math.exp(2.0)]]))


@pytest.mark.parametrize("name", ["tis", "masked_is", "seq_mask"])
def test_the_step_scales_its_advantages_by_the_configured_correction(name):
    from core.config import AlgoConfig, validate
    from core.loop import Timer, advantages
    from core.protocol import Batch

    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    old = torch.randn(4, 4) * mask
    rollout = (old + torch.randn(4, 4)) * mask
    batch = Batch({"token_rewards": torch.tensor([[0, 0, 1.0, 0], [0, 0.0, 0, 0], [0, 0, 0, 1.0], [0.0, 0, 0, 0]]),
                   "response_mask": mask, "old_logprobs": old, "rollout_logprobs": rollout},
                  non_tensors={"uid": ["a", "a", "b", "b"]})
    plain = Batch(dict(batch.tensors), non_tensors={"uid": ["a", "a", "b", "b"]})
    cfg = validate(AlgoConfig, {"adv": {"estimator": "grpo"}, "tis_cap": 2.0, "off_policy_correction": name})
    advantages(batch, cfg, Timer())
    advantages(plain, validate(AlgoConfig, {"adv": {"estimator": "grpo"}}), Timer())
    torch.testing.assert_close(batch["advantages"], plain["advantages"] * OFF_POLICY[name](old, rollout, mask, 2.0))
