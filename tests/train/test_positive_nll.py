"""VAPO's positive-example NLL in the actor's update (``actor.positive_nll_coef``): its logged value is the
token-mean NLL of the correct samples under the policy before the step, it is zero and changes nothing when no
sample is correct, and it changes the update when some are."""

import pytest
import torch

from core.config import ActorConfig, OptimConfig
from core.train.fsdp import FSDPActor
from core.worker import RoleSpec
from core.worker_group import LocalWorkerGroup
from tests.train.test_shared_prompt import UNEVEN, grouped_batch

TRAINED = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", "advantages")


def update_once(model_dir, scores, coef):
    """One mini-batch of 6 rows (3 micro-batches), one optimizer step; returns the batch with its old log-probs,
    the update's metrics and the parameters after it."""
    b = grouped_batch(**UNEVEN).index(slice(0, 6)).select(*TRAINED)
    b["scores"] = torch.tensor(scores, dtype=torch.float32)
    cfg = ActorConfig(model=str(model_dir), dtype="float32", ppo_mini_batch_size=6, micro_batch_size=2,
                      positive_nll_coef=coef, optim=OptimConfig(lr=1e-2))
    group = LocalWorkerGroup({"actor": RoleSpec(FSDPActor, {"cfg": cfg})})
    try:
        actor = group.role("actor")
        b = b.union(actor.dp_split(FSDPActor.compute_logprobs, b))
        metrics = actor.call_all(FSDPActor.update, b)[0]
        return b, metrics, actor.call_all(FSDPActor.full_state_dict)[0]
    finally:
        group.shutdown()


def test_without_a_correct_sample_the_nll_is_zero_and_the_update_unchanged(tiny_model_dir):
    wrong = [0.0, -1.0, 0.0, 0.0, -1.0, 0.0]
    _, m_nll, with_nll = update_once(tiny_model_dir, wrong, 0.1)
    _, m_off, without = update_once(tiny_model_dir, wrong, 0.0)
    assert m_nll["actor/nll_loss"] == 0.0 and "actor/nll_loss" not in m_off
    assert all(torch.equal(with_nll[k], without[k]) for k in without)
    assert m_nll["actor/grad_norm"] == m_off["actor/grad_norm"]


def test_the_nll_is_the_correct_samples_token_mean_and_moves_the_update(tiny_model_dir):
    scores = [1.0, 0.0, 0.0, 1.0, -1.0, 0.0]
    b, m_nll, with_nll = update_once(tiny_model_dir, scores, 0.1)
    _, m_off, without = update_once(tiny_model_dir, scores, 0.0)
    positive = b["response_mask"] * (b["scores"] > 0)[:, None]
    expected = -(b["old_logprobs"] * positive).sum() / positive.sum()    # before the step: the old policy
    assert expected > 1 and m_nll["actor/nll_loss"] == pytest.approx(float(expected), rel=1e-5)
    assert m_nll["actor/pg_loss"] == pytest.approx(m_off["actor/pg_loss"], rel=1e-6, abs=1e-7)
    assert m_nll["actor/grad_norm"] != pytest.approx(m_off["actor/grad_norm"], rel=1e-3)
    assert any(not torch.equal(with_nll[k], without[k]) for k in without)
