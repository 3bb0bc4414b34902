"""Colocated vs split placement: the same GRPO step with actor, reference and rollout in one process per rank, and
with the rollout on a pool of its own (weights synced through the controller), on real Ray, in one run.

On this 2-core machine: colocated = one pool of 2 ranks holding all three roles (every phase uses both cores);
split = actor + reference on a 1-rank pool, rollout on another 1-rank pool (each phase gets one core, since the
step runs its phases one after another, and the sync crosses processes). The ratio is split / colocated step time;
on GPUs the split layout pays off when generation and training overlap (asynchronous RL), which this step
does not do. Full size (``--benchmark``): SmolLM2-135M-Instruct, 8 prompts x n=4, 32 new tokens, median of 2 steps
after a warm-up step. Smoke size: the tiny random model, 1 step.

HybridFlow's four-model PPO (actor, critic, reference, reward model; recipes/ppo/qwen2_7b_rm*.yaml at full scale)
is placed both ways too: all colocated on the 2 ranks, or split as qwen2_7b_rm_split.yaml splits it -- the policy
side (actor, reference, rollout) on one 1-rank pool, the scorers (critic, reward model) on another. The reward
model is SmolLM2-135M-Instruct with a fresh score head: the same compute as a trained one.
"""

from __future__ import annotations

import pytest

from bench.test_grpo_step import arith_rows, grpo_specs, grpo_step_config, reward
from core.config import AdvantageConfig, AlgoConfig, CriticConfig, KLInRewardConfig, OptimConfig, RewardModelConfig
from core.train.critic import FSDPCritic
from core.train.reward_model import RewardModelWorker
from core.loop import Roles, kl_controller, prompts_from_rows, step
from core.models import default_dtype, resolve_model
from core.worker import RoleSpec
from core.worker_group import ResourcePool, WorkerGroup


@pytest.fixture(scope="module")
def ray_session(ray_shared):
    yield


def median_step_seconds(groups: list[WorkerGroup], roles: Roles, rows, cfg: AlgoConfig, steps: int,
                        kl_ctrl=None) -> float:
    times = []
    try:
        for i in range(steps + 1):
            _, metrics = step(roles, prompts_from_rows(rows), cfg, reward, kl_ctrl=kl_ctrl)
            if i:
                times.append(metrics["timing_s/step"])
    finally:
        for g in groups:
            g.shutdown()
    return sorted(times)[len(times) // 2]


def test_colocated_vs_split_placement(ray_session, full_size, report, tiny_model_dir):
    path = resolve_model("SmolLM2-135M-Instruct") if full_size else str(tiny_model_dir)
    P, n, new, steps = (8, 4, 32, 2) if full_size else (2, 4, 8, 1)
    dtype = str(default_dtype()).removeprefix("torch.")  # from the CPU's flags, as `dtype: auto`
    rows, s, cfg = arith_rows(P), grpo_specs(path, dtype, P * n), grpo_step_config(n, new)
    main = WorkerGroup(ResourcePool(slots_per_node=2), s, name="main")
    colocated = median_step_seconds([main], Roles(main.role("actor"), main.role("rollout"), main.role("ref")),
                                    rows, cfg, steps)
    train = WorkerGroup(ResourcePool(slots_per_node=1), {"actor": s["actor"], "ref": s["ref"]}, name="train")
    gen = WorkerGroup(ResourcePool(slots_per_node=1), {"rollout": s["rollout"]}, name="gen")
    split = median_step_seconds([train, gen], Roles(train.role("actor"), gen.role("rollout"), train.role("ref")),
                                rows, cfg, steps)
    r = report("placement", model=path.rsplit("/", 1)[-1], dtype=dtype, prompts=P, n=n, max_new_tokens=new,
               colocated_step_s=colocated, split_step_s=split, split_over_colocated=split / colocated)
    assert r["colocated_step_s"] > 0 and r["split_step_s"] > 0


def ppo_four_model_specs(path: str, dtype: str, samples: int) -> dict[str, RoleSpec]:
    """The GRPO bench's actor, reference and rollout, plus a critic (same backbone) and a reward model."""
    specs = grpo_specs(path, dtype, samples)
    critic = CriticConfig(model=path, dtype=dtype, ppo_mini_batch_size=samples // 2, micro_batch_size=samples // 4,
                          optim=OptimConfig(lr=1e-5, warmup_steps=0))
    specs["critic"] = RoleSpec(FSDPCritic, {"cfg": critic})
    specs["reward_model"] = RoleSpec(RewardModelWorker, {"cfg": RewardModelConfig(model=path, dtype=dtype),
                                                         "policy_model": path})
    return specs


@pytest.mark.heavy  # ~18 s at smoke size; test_colocated_vs_split_placement stays in make test
def test_four_model_ppo_colocated_vs_split(ray_session, full_size, report, tiny_model_dir):
    path = resolve_model("SmolLM2-135M-Instruct") if full_size else str(tiny_model_dir)
    P, n, new, steps = (8, 4, 32, 2) if full_size else (2, 4, 8, 1)
    dtype = str(default_dtype()).removeprefix("torch.")
    rows, s = arith_rows(P), ppo_four_model_specs(path, dtype, P * n)
    cfg = AlgoConfig(sampling=grpo_step_config(n, new).sampling, adv=AdvantageConfig(estimator="gae"),
                     kl_in_reward=KLInRewardConfig(coef=0.01), reward_function_weight=0.0)
    main = WorkerGroup(ResourcePool(slots_per_node=2), s, name="main")
    colocated = median_step_seconds([main], Roles(*(main.role(r) for r in ("actor", "rollout", "ref", "critic",
                                                                           "reward_model"))), rows, cfg, steps,
                                    kl_controller(cfg))
    policy = WorkerGroup(ResourcePool(slots_per_node=1), {k: s[k] for k in ("actor", "ref", "rollout")}, name="policy")
    scorers = WorkerGroup(ResourcePool(slots_per_node=1), {k: s[k] for k in ("critic", "reward_model")}, name="scorers")
    split = median_step_seconds([policy, scorers], Roles(policy.role("actor"), policy.role("rollout"), policy.role("ref"),
                                                         scorers.role("critic"), scorers.role("reward_model")),
                                rows, cfg, steps, kl_controller(cfg))
    r = report("placement_four_model_ppo", model=path.rsplit("/", 1)[-1], dtype=dtype, prompts=P, n=n,
               max_new_tokens=new, colocated_step_s=colocated, split_step_s=split, split_over_colocated=split / colocated)
    assert r["colocated_step_s"] > 0 and r["split_step_s"] > 0
