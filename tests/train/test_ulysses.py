"""Ulysses sequence parallelism (core/train/ulysses.py, ``actor.ulysses_sp``) on 2 Ray ranks: the FSDP actor with
sp = 2 (both ranks take the same rows, half of each row's positions) gives sp = 1's log-probs, entropy, loss, gradient
norm and updated weights on the same batch (sp = 1 here: the same 2 ranks as data parallelism, 2 rows each).

The batch is built so that every mechanism is on the path: rows of different prompt and response lengths (left and
right padding), a trimmed width that N does not divide (a padding column), and the boundary between the two
slices inside the responses, so that a position on rank 0 predicts a token on rank 1 (labels shifted after slicing
get it wrong). Two models: 2 KV heads (one per rank) and 1 KV head (repeated per query head first). fp32;
tolerances: log-probs 1e-5, metrics rel 1e-4, weights after one AdamW step 1e-6 (lr 1e-4, so the step is seen)."""

import pytest
import torch

from core.config import ActorConfig, OptimConfig
from core.train.fsdp import FSDPActor
from core.train.policy import PolicyWorker
from core.worker import RoleSpec
from core.worker_group import ResourcePool, WorkerGroup
from tests.train.test_micro_batches import uneven_batch

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from core.models import tiny_random_model

    root = tmp_path_factory.mktemp("ulysses")
    return {kv: tiny_random_model(root / f"kv{kv}", num_key_value_heads=kv) for kv in (2, 1)}


def actor(model, sp: int) -> RoleSpec:
    cfg = ActorConfig(model=str(model), dtype="float32", ppo_mini_batch_size=4, micro_batch_size=2, ulysses_sp=sp,
                      entropy_coef=0.01, optim=OptimConfig(lr=1e-4, warmup_steps=0))
    return RoleSpec(FSDPActor, {"cfg": cfg}, mp_size=sp)


@pytest.mark.parametrize("kv_heads", [2, 1], ids=["kv-heads-split", "kv-heads-repeated"])
def test_sp2_gives_the_logprobs_loss_and_gradients_of_sp1(ray_module_session, models, kv_heads):
    # trimmed width 5 + 6 = 11 columns -> 2 x 6 with one padding column; column 4 predicts response token 0, so
    # rank 0 (columns 0-5) predicts tokens 0-1 and rank 1 the rest: column 5 predicts column 6, on rank 1
    batch = uneven_batch([5, 2, 4, 1], [6, 3, 5, 2])
    group = WorkerGroup(ResourcePool(slots_per_node=2), {"sp": actor(models[kv_heads], 2),
                                                         "dp": actor(models[kv_heads], 1)}, timeout_s=300)
    try:
        sp, dp = group.role("sp"), group.role("dp")
        mask = batch["response_mask"]
        a = sp.dp_split(PolicyWorker.compute_logprobs, batch, with_entropy=True)
        b = dp.dp_split(PolicyWorker.compute_logprobs, batch, with_entropy=True)
        for key in ("old_logprobs", "entropy"):
            torch.testing.assert_close(a[key] * mask, b[key] * mask, rtol=0, atol=1e-5)
        assert bool((a["old_logprobs"][mask > 0] < 0).all())    # every response token has its log-prob
        # a prompt longer than a slice: rank 0's columns (0-5 of 11) predict no response token
        long = uneven_batch([8, 6], [3, 1])
        got, want = (r.dp_split(PolicyWorker.compute_logprobs, long)["old_logprobs"] * long["response_mask"]
                     for r in (sp, dp))
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        one, two = sp.dp_split(PolicyWorker.update, batch), dp.dp_split(PolicyWorker.update, batch)
        assert len(one) == 1 and len(two) == 2                     # one sequence-parallel group; two DP ranks
        assert one[0]["actor/pg_loss"] == pytest.approx(sum(m["actor/pg_loss"] for m in two), rel=1e-4)
        assert one[0]["actor/grad_norm"] == pytest.approx(two[0]["actor/grad_norm"], rel=1e-4)
        assert one[0]["actor/entropy"] == pytest.approx(sum(m["actor/entropy"] for m in two) / 2, rel=1e-4)
        after_sp, after_dp = sp.call_all(PolicyWorker.full_state_dict)[0], dp.call_all(PolicyWorker.full_state_dict)[0]
        moved = max(float((after_dp[k] - w).abs().max()) for k, w in models_weights(models[kv_heads]).items())
        assert moved > 5e-5                                        # the step moved the weights
        for k in after_dp:
            torch.testing.assert_close(after_sp[k], after_dp[k], rtol=0, atol=1e-6)
    finally:
        group.shutdown()


def models_weights(path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


@pytest.mark.heavy  # make test-heavy (CI): the unit test above covers each mechanism; this one the trainer's wiring
def test_a_run_with_sp2_gives_the_metrics_of_sp1(ray_module_session, tmp_path, tiny_model_dir):
    """Through the whole trainer (``fit``, GRPO with a KL loss: actor, reference and rollout on one 2-rank pool), the
    actor and reference on one sequence-parallel group of 2 give the 2 data-parallel ranks' metrics (rel 1e-4), a
    rank whose slice of some micro-batch holds no response position included, and activation recomputation."""
    from tests.test_checkpoint import fit_run, write_run

    conf = write_run(tmp_path, tiny_model_dir, total_steps=2, save_freq=0, backend="ray")
    # one mini-batch per step: with two, the 2 DP ranks' first would hold other rows than the one group's first
    one = fit_run(conf, tmp_path / "sp1", "actor.ppo_mini_batch_size=8")
    # with activation recomputation: backward re-runs the all-to-alls of each layer's attention
    two = fit_run(conf, tmp_path / "sp2", "actor.ppo_mini_batch_size=8", "actor.ulysses_sp=2",
                  "actor.gradient_checkpointing=true")
    assert sorted(one) == sorted(two) == [1, 2]
    for s in one:
        assert one[s].keys() == two[s].keys()
        off = {k: (v, two[s][k]) for k, v in one[s].items() if two[s][k] != pytest.approx(v, rel=1e-4, abs=1e-6)}
        assert not off, (s, off)
