"""Old log-probs left to the update: the rows the actor's update trains on before its first optimizer step take
their old log-probs from that update's own forward (the policy has not moved yet), one forward fewer. The update's
loss, gradient and ratio statistics and the old log-probs it reports back are those of a separate pass."""

import pytest
import torch

from core.config import ActorConfig, OptimConfig
from core.train.fsdp import FSDPActor
from core.protocol import Batch
from core.worker import RoleSpec
from core.worker_group import LocalWorkerGroup, WorkerError
from tests.train.test_shared_prompt import UNEVEN, grouped_batch

TRAINED = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", "advantages")


def old_then_update(model_dir, leave: bool, epochs: int = 1):
    """6 rows, mini-batches of 4 and 2: compute_logprobs (leaving rows to the update or not), then one update.
    Returns what compute_logprobs gave, the update's metrics and the old log-probs the update used."""
    b = grouped_batch(**UNEVEN).index(slice(0, 6)).select(*TRAINED)
    cfg = ActorConfig(model=str(model_dir), dtype="float32", ppo_mini_batch_size=4, micro_batch_size=2,
                      ppo_epochs=epochs, optim=OptimConfig(lr=1e-2))
    group = LocalWorkerGroup({"actor": RoleSpec(FSDPActor, {"cfg": cfg})})
    try:
        actor = group.role("actor")
        got = actor.dp_split(FSDPActor.compute_logprobs, b, leave_to_update=leave)
        b = b.union(got)
        metrics = actor.call_all(FSDPActor.update, b)[0]
        used = actor.dp_split(FSDPActor.update_old_logprobs, b)["old_logprobs"] if leave else b["old_logprobs"]
        return got, metrics, used * b["response_mask"]
    finally:
        group.shutdown()


def test_the_first_minibatch_is_left_to_the_update_and_gives_the_same_update(tiny_model_dir):
    got, m_left, used_left = old_then_update(tiny_model_dir, leave=True)
    assert got["old_from_update"].tolist() == [True] * 4 + [False] * 2       # the first mini-batch: 4 rows
    assert torch.isnan(got["old_logprobs"][:4]).all()                       # not computed before the update
    _, m_full, used_full = old_then_update(tiny_model_dir, leave=False)
    assert used_full.abs().max() > 1
    torch.testing.assert_close(used_left, used_full, atol=1e-5, rtol=1e-5)  # filled in = a separate pass's
    for k in ("actor/pg_loss", "actor/grad_norm", "actor/ppo_kl", "actor/pg_clipfrac"):
        assert m_left[k] == pytest.approx(m_full[k], rel=1e-4, abs=1e-6), k


def test_with_several_epochs_every_row_is_computed_before_the_update(tiny_model_dir):
    got, _, _ = old_then_update(tiny_model_dir, leave=True, epochs=2)
    assert not got["old_from_update"].any() and got["old_logprobs"][:4].abs().sum() > 0


def test_an_update_refuses_rows_left_to_it_that_it_reaches_after_moving(tiny_model_dir):
    b = grouped_batch(**UNEVEN).index(slice(0, 6)).select(*TRAINED)
    b = b.union(Batch({"old_logprobs": torch.zeros(6, 6), "old_from_update": torch.arange(6) >= 2}))
    cfg = ActorConfig(model=str(tiny_model_dir), dtype="float32", ppo_mini_batch_size=4, micro_batch_size=2)
    group = LocalWorkerGroup({"actor": RoleSpec(FSDPActor, {"cfg": cfg})})
    try:
        with pytest.raises(WorkerError, match="before its first optimizer step"):
            group.role("actor").call_all(FSDPActor.update, b)
    finally:
        group.shutdown()
