"""FSDP2 actor + colocated rollout on real Ray (2 CPU ranks, gloo) with a tiny real model.

- rollout log-probs agree with the FSDP engine's recomputed log-probs (fp32, mean |diff| <= 1e-3);
- after a weight sync, the rollout engine's weights equal the actor's full weights exactly;
- a 2-rank update sees the same gradient (norm) and loss as a 1-rank update of the same mini-batch;
- the reference (frozen) policy gives the actor's log-probs before any update;
- a weight sync that a peer never joins fails with WorkerTimeoutError instead of hanging;
- the bf16 mismatch figure (printed; bf16 rollout vs bf16-compute FSDP on the same tokens).
"""

import numpy as np
import pytest
import torch

from core.config import (ActorConfig, AdvantageConfig, AlgoConfig, OptimConfig, PolicyLossConfig, RolloutConfig,
                         SamplingParams)
from core.algos import compute_advantages
from core.train.fsdp import FSDPActor
from core.protocol import Batch
from core.rollout.worker import RolloutWorker
from core.worker import RoleSpec
from core.worker_group import LocalWorkerGroup, ResourcePool, WorkerGroup, WorkerTimeoutError

pytestmark = pytest.mark.ray
PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=3)


def specs(model_dir, dtype="float32"):
    actor = ActorConfig(model=str(model_dir), dtype=dtype, ppo_mini_batch_size=8, micro_batch_size=2,
                        optim=OptimConfig(lr=1e-2), loss=PolicyLossConfig(), temperature=PARAMS.temperature)
    return {"actor": RoleSpec(FSDPActor, {"cfg": actor}),
            "ref": RoleSpec(FSDPActor, {"cfg": ActorConfig(model=str(model_dir), dtype="float32", trainable=False)}),
            "rollout": RoleSpec(RolloutWorker, {"cfg": RolloutConfig(model=str(model_dir), dtype=dtype,
                                                                     max_prompt_length=32)})}


def prompts(n=4) -> Batch:
    return Batch(non_tensors={"prompt": [[{"role": "user", "content": f"q{i} " + "ab" * i}] for i in range(n)],
                              "uid": [f"u{i}" for i in range(n)]})


@pytest.fixture(scope="module")
def group(tiny_model_dir, ray_shared):
    g = WorkerGroup(ResourcePool(slots_per_node=2), specs(tiny_model_dir), timeout_s=300)
    yield g
    g.shutdown()


def rollout_batch(group_or_local) -> Batch:
    batch = group_or_local.role("rollout").dp_split(RolloutWorker.generate, prompts(), PARAMS)
    scores = (torch.arange(len(batch)) % 3).float()  # varies inside each group of n=2
    mask = batch["response_mask"]
    batch["token_rewards"] = torch.zeros_like(mask).scatter(1, (mask.sum(-1).long() - 1)[:, None], scores[:, None])
    return batch


def test_rollout_and_fsdp_logprobs_agree_and_ref_equals_actor(group):
    batch = rollout_batch(group)
    assert len(batch) == 8 and batch["prompts"].shape[1] == 32 and batch["responses"].shape[1] == 8
    old = group.role("actor").dp_split(FSDPActor.compute_logprobs, batch)
    ref = group.role("ref").dp_split(FSDPActor.compute_logprobs, batch)
    mask = batch["response_mask"]
    diff = (old["old_logprobs"] - batch["rollout_logprobs"]).abs() * mask
    assert diff.sum() / mask.sum() <= 1e-3 and diff.max() <= 1e-3
    torch.testing.assert_close(ref["old_logprobs"], old["old_logprobs"])


def test_update_then_sync_makes_rollout_weights_equal_actor_weights(group):
    batch = rollout_batch(group)
    batch = batch.union(group.role("actor").dp_split(FSDPActor.compute_logprobs, batch).select("old_logprobs"))
    batch["advantages"], _ = compute_advantages(batch, AdvantageConfig(estimator="grpo"))
    before = group.role("rollout").call_rank0(RolloutWorker.engine_state_dict)
    metrics = group.role("actor").dp_split(FSDPActor.update, batch)  # one metrics dict per DP rank
    assert len(metrics) == 2 and all(np.isfinite(m["actor/grad_norm"]) for m in metrics)
    sync = group.role("rollout").call_all(RolloutWorker.sync_weights)
    assert sync[0]["sync/buckets"] >= 1 and sync[0]["sync/megabytes"] > 0
    assert sync[0]["sync/peak_memory_megabytes"] >= 0 and "sync/retained_memory_megabytes" in sync[0]
    actor_full = group.role("actor").call_all(FSDPActor.full_state_dict)[0]
    for rank_state in group.role("rollout").call_all(RolloutWorker.engine_state_dict):
        assert rank_state.keys() == actor_full.keys()
        assert all(torch.equal(rank_state[k], actor_full[k]) for k in actor_full)
    assert any(not torch.equal(before[k], actor_full[k]) for k in actor_full)  # the update moved the weights


def test_two_ranks_see_the_gradient_and_loss_of_one_rank(group, tiny_model_dir):
    batch = rollout_batch(group)
    batch = batch.union(group.role("ref").dp_split(FSDPActor.compute_logprobs, batch).select("old_logprobs"))
    batch["advantages"], _ = compute_advantages(batch, AdvantageConfig(estimator="grpo"))
    local = LocalWorkerGroup({"actor": specs(tiny_model_dir)["actor"]})
    try:
        one = local.role("actor").call_all(FSDPActor.update, batch)[0]
    finally:
        local.shutdown()
    fresh = WorkerGroup(ResourcePool(slots_per_node=2), {"actor": specs(tiny_model_dir)["actor"]}, timeout_s=300)
    try:
        two = fresh.role("actor").dp_split(FSDPActor.update, batch)
    finally:
        fresh.shutdown()
    assert two[0]["actor/grad_norm"] == pytest.approx(one["actor/grad_norm"], rel=1e-4)
    assert sum(m["actor/pg_loss"] for m in two) == pytest.approx(one["actor/pg_loss"], rel=1e-4, abs=1e-6)


def test_a_sync_that_a_peer_never_joins_times_out_instead_of_hanging(group, tiny_model_dir):
    # rank 1 is never called, so rank 0 waits in the first all-gather: the controller must give up, not hang
    spec = specs(tiny_model_dir)
    stalled = WorkerGroup(ResourcePool(slots_per_node=2), {"actor": spec["actor"], "rollout": spec["rollout"]},
                          timeout_s=300)
    try:
        with pytest.raises(WorkerTimeoutError, match=r"RolloutWorker.sync_weights.*no result after 2s from ranks \[0\]"):
            stalled.role("rollout").call_rank0(RolloutWorker.sync_weights, timeout_s=2)
    finally:
        stalled.shutdown()  # kills the hung rank


def test_bf16_rollout_vs_fsdp_logprob_mismatch_is_reported(tiny_model_dir):
    # bf16 on both sides: the engine's bf16 weights vs FSDP2's bf16 compute of fp32 master weights
    local = LocalWorkerGroup(specs(tiny_model_dir, dtype="bfloat16"))
    try:
        batch = rollout_batch(local)
        old = local.role("actor").call_all(FSDPActor.compute_logprobs, batch)[0]
    finally:
        local.shutdown()
    mask = batch["response_mask"]
    diff = (old["old_logprobs"] - batch["rollout_logprobs"]).abs() * mask
    mean, peak = float(diff.sum() / mask.sum()), float(diff.max())
    print(f"bf16 rollout vs FSDP log-prob |diff|: mean {mean:.2e} max {peak:.2e}")
    assert mean <= 0.05  # bf16 has 8 mantissa bits: a few 1e-3 per token, not the 0 of fp32


def test_split_placement_syncs_the_rollout_pool_from_the_actor_pool(group, tiny_model_dir):
    """Actor on one pool, rollout on another (separate processes and torch.distributed worlds): after an update,
    a whole RL step's sync goes bucket by bucket through the controller and the engine equals the actor exactly."""
    from core.loop import Roles, step

    s = specs(tiny_model_dir)
    rollout_cfg = s["rollout"].kwargs["cfg"]
    s["rollout"] = RoleSpec(RolloutWorker, {"cfg": type(rollout_cfg)(**{**vars(rollout_cfg), "sync_bucket_megabytes": 0})})
    # half a CPU per rank: the module's colocated group holds 2 of the session's 4
    actors = WorkerGroup(ResourcePool(slots_per_node=2, cpus_per_slot=0.5), {"actor": s["actor"]}, name="train",
                         timeout_s=300)
    rollouts = WorkerGroup(ResourcePool(slots_per_node=1, cpus_per_slot=0.5), {"rollout": s["rollout"]}, name="gen",
                           timeout_s=300)
    try:
        roles = Roles(actor=actors.role("actor"), rollout=rollouts.role("rollout"))
        before = roles.rollout.call_rank0(RolloutWorker.engine_state_dict)
        reward = lambda source, text, truth, extra=None: sum(map(ord, text)) / 1e3  # noqa: E731 differs within groups
        batch = prompts()
        batch.non_tensors.update({"data_source": ["x"] * 4, "ground_truth": ["0"] * 4, "extra_info": [{}] * 4})
        _, metrics = step(roles, batch, AlgoConfig(sampling=PARAMS), reward)
        actor_full = roles.actor.call_all(FSDPActor.full_state_dict)[0]
        engine = roles.rollout.call_rank0(RolloutWorker.engine_state_dict)
    finally:
        actors.shutdown()
        rollouts.shutdown()
    # bucket size 0: one bucket per tensor, so the plan covers every weight one by one
    assert metrics["sync/buckets"] == len(actor_full) and metrics["sync/megabytes"] > 0
    assert engine.keys() == actor_full.keys() and all(torch.equal(engine[k], actor_full[k]) for k in actor_full)
    assert any(not torch.equal(before[k], actor_full[k]) for k in actor_full)
