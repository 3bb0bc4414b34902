"""The reward-hacking watch (core.loop step metrics with a reward model): the model's mean score, the reward
function's mean on the same samples and their correlation, by hand."""

import pytest
import torch

from core.loop import _reward_model_metrics
from core.protocol import Batch


def test_model_and_function_means_and_their_correlation_by_hand():
    # rm = (1, 2, 3, 4), fn = (0, 0, 1, 1): means 2.5 and 0.5; deviations (-1.5, -0.5, 0.5, 1.5) and
    # (-0.5, -0.5, 0.5, 0.5): covariance sum 2.0, norms sqrt(5) and 1 -> r = 2 / sqrt(5) = 0.894
    batch = Batch({"rm_scores": torch.tensor([1.0, 2.0, 3.0, 4.0]), "function_scores": torch.tensor([0.0, 0, 1, 1])})
    m = _reward_model_metrics(batch)
    assert m == {"reward/model_mean": 2.5, "reward/function_mean": 0.5,
                 "reward/model_function_corr": pytest.approx(2 / 5 ** 0.5)}


def test_no_reward_model_no_keys_and_a_constant_truth_has_no_correlation():
    assert _reward_model_metrics(Batch({"scores": torch.ones(3)})) == {}
    m = _reward_model_metrics(Batch({"rm_scores": torch.tensor([1.0, 2.0]), "function_scores": torch.ones(2)}))
    assert m == {"reward/model_mean": 1.5, "reward/function_mean": 1.0}
