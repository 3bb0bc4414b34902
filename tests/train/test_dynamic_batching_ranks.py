"""Dynamic batching (``max_tokens_per_micro``) at DP = 2 on real Ray ranks (actor, critic, reward model): the ranks run equal numbers of FSDP
forwards even when their rows cut into different numbers of micro-batches, so log-probs, values and the update's
KL metric equal the 1-rank results. Before the fix, ``compute_logprobs`` / ``compute_values`` looped over each
rank's own micro-batches: a rank with more of them waited in an all-gather its peer never joined (here: a
``WorkerTimeoutError`` after 60 s instead of the run's 30-minute hang), and the update's ``actor/kl_loss`` added the
KL of the dummy passes that equalise the update."""

import pytest
import torch

from core.config import ActorConfig, CriticConfig, OptimConfig, PolicyLossConfig, RewardModelConfig
from core.train.critic import FSDPCritic
from core.train.fsdp import FSDPActor
from core.train.reward_model import RewardModelWorker
from core.loop import reduce_over_ranks
from core.worker import RoleSpec
from core.worker_group import LocalWorkerGroup, ResourcePool, WorkerGroup
from tests.train.test_micro_batches import uneven_batch

pytestmark = pytest.mark.ray
BUDGET = 2 * (8 + 6)  # two rows at the batch's full width (Tp 8 + Tr 6) per micro-batch


def specs(model_dir):
    actor = ActorConfig(model=str(model_dir), dtype="float32", ppo_mini_batch_size=8, micro_batch_size=2,
                        max_tokens_per_micro=BUDGET, kl_loss_coef=0.1, optim=OptimConfig(lr=1e-3),
                        loss=PolicyLossConfig())
    critic = CriticConfig(model=str(model_dir), dtype="float32", ppo_mini_batch_size=8, micro_batch_size=2,
                          max_tokens_per_micro=BUDGET, optim=OptimConfig(lr=1e-3))
    rm = RewardModelConfig(model=str(model_dir), dtype="float32", max_tokens_per_micro=BUDGET)
    return {"actor": RoleSpec(FSDPActor, {"cfg": actor}), "critic": RoleSpec(FSDPCritic, {"cfg": critic}),
            "reward_model": RoleSpec(RewardModelWorker, {"cfg": rm, "policy_model": str(model_dir)})}


def skewed():
    """8 rows: dp_split gives rank 0 the first 4 (long: 3-4 micro-batches under the budget), rank 1 the last 4
    (short: all in one)."""
    b = uneven_batch([8, 7, 8, 6, 1, 2, 1, 1], [6, 6, 5, 6, 1, 1, 2, 1])
    b["ref_logprobs"] = b["old_logprobs"] + 0.25
    b["values"] = torch.zeros_like(b["response_mask"])
    b["returns"] = b["advantages"] * b["response_mask"]
    return b


@pytest.fixture(scope="module")
def two_ranks(tiny_model_dir, ray_shared):
    g = WorkerGroup(ResourcePool(slots_per_node=2), specs(tiny_model_dir), timeout_s=60)
    yield g
    g.shutdown()


def test_log_probs_values_and_kl_equal_one_rank_under_a_token_budget(two_ranks, tiny_model_dir):
    batch = skewed()
    one = LocalWorkerGroup(specs(tiny_model_dir))
    try:
        want_lp = one.role("actor").call_rank0(FSDPActor.compute_logprobs, batch)["old_logprobs"]
        want_v = one.role("critic").call_rank0(FSDPCritic.compute_values, batch)["values"]
        want_kl = one.role("actor").call_rank0(FSDPActor.update, batch)["actor/kl_loss"]
    finally:
        one.shutdown()
    got_lp = two_ranks.role("actor").dp_split(FSDPActor.compute_logprobs, batch)["old_logprobs"]
    got_v = two_ranks.role("critic").dp_split(FSDPCritic.compute_values, batch)["values"]
    mask = batch["response_mask"] > 0
    torch.testing.assert_close(got_lp[mask], want_lp[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_v[mask], want_v[mask], atol=1e-5, rtol=1e-5)
    # the KL term of the update: the ranks' parts add up to the 1-rank value, dummy passes excluded
    got_kl = reduce_over_ranks(two_ranks.role("actor").dp_split(FSDPActor.update, batch))["actor/kl_loss"]
    assert got_kl == pytest.approx(want_kl, rel=1e-4)


def test_reward_model_scores_at_two_ranks_equal_one_rank(two_ranks, tiny_model_dir):
    """Rank 0's long rows take several token-budget forwards, rank 1's short ones one: the padding passes keep
    FSDP's all-gathers matched, and the scores are the 1-rank ones (and a direct unsharded forward's)."""
    from core.train.reward_model import load_reward_model, sequence_scores

    batch = skewed()
    one = LocalWorkerGroup(specs(tiny_model_dir))
    try:
        want = one.role("reward_model").call_rank0(RewardModelWorker.compute_rm_scores, batch)["rm_scores"]
    finally:
        one.shutdown()
    got = two_ranks.role("reward_model").dp_split(RewardModelWorker.compute_rm_scores, batch)["rm_scores"]
    assert got.shape == (8,) and want.std() > 1e-4
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.manual_seed(0)  # the role's seed: the same new score head
    Tp = batch["input_ids"].shape[1] - batch["responses"].shape[1]
    seqs = [ids[m > 0].tolist() for ids, m in zip(batch["input_ids"], batch["attention_mask"])]
    assert Tp == 8
    direct = sequence_scores(load_reward_model(str(tiny_model_dir)), seqs, pad_id=0)
    torch.testing.assert_close(got, direct, atol=1e-5, rtol=1e-5)
