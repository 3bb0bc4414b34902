"""The roles of a run: which worker class runs each (``role_specs``: the actor and its frozen reference on their
training engine, the rollout engine, the critic, the reward model, the implicit PRM, the distillation teacher), and the weight sync between
pools (with the rollout on a pool of its own the controller moves the actor's weights to it bucket by bucket;
colocated, each process syncs itself: ``core.rollout.worker.RolloutWorker.sync_weights``)."""

from __future__ import annotations

import time
from dataclasses import replace

from core.config import ActorConfig, CriticConfig, LoraConfig, PolicyLossConfig, RunConfig, TeacherConfig
from core.rollout.weight_sync import WeightSyncError
from core.rollout.worker import RolloutWorker
from core.train.critic import FSDPCritic
from core.train.fsdp import FSDPActor
from core.train.lora import LoraReference
from core.train.policy import PolicyWorker
from core.train.reward_model import RewardModelWorker
from core.worker import RoleSpec
from core.worker_group import RoleGroup


def reference_config(actor: ActorConfig) -> ActorConfig:
    """The frozen reference: the actor's config (its model, dtype, engine, layout, micro-batching, temperature,
    offload), not trainable and without adapters -- so a setting of the actor's forward reaches the reference's."""
    return replace(actor, trainable=False, lora=LoraConfig())


def teacher_config(actor: ActorConfig, teacher: TeacherConfig) -> ActorConfig:
    """On-policy distillation's teacher: the reference's config (the actor's engine, layout, temperature; frozen, no
    adapters) with the teacher's model, dtype, offload mode and micro-batch size."""
    return replace(reference_config(actor), model=teacher.model, dtype=teacher.dtype, offload=teacher.offload,
                   micro_batch_size=teacher.micro_batch_size or actor.micro_batch_size)


def prm_actor_config(cfg: RunConfig) -> ActorConfig:
    """The ``prm`` role's engine config: a trainable policy whose loss is ``implicit_prm``, at the actor's
    temperature (so that at the start pi_prm = pi_ref exactly and every reward is 0)."""
    p = cfg.implicit_prm
    return ActorConfig(model=p.model or cfg.actor.model, dtype=p.dtype, optim=p.optim,
                       ppo_mini_batch_size=p.ppo_mini_batch_size, micro_batch_size=p.micro_batch_size,
                       max_tokens_per_micro=p.max_tokens_per_micro, share_prompt=p.share_prompt,
                       loss=PolicyLossConfig(name="implicit_prm", prm_beta=p.beta), loss_agg_mode="seq-mean-token-mean",
                       temperature=cfg.actor.temperature, gradient_checkpointing=p.gradient_checkpointing,
                       offload=p.offload, seed=p.seed)


def policy_spec(actor: ActorConfig, exact: bool = False) -> RoleSpec:
    """The actor's (or the reference's) role on its training engine; a Megatron model replica's tp x pp ranks, or
    a Ulysses group's ulysses_sp ranks, share one chunk of rows. ``exact``: its forward on the rollout engine's
    kernels (``rollout.exact_logprobs``)."""
    if actor.strategy == "megatron":
        from core.train.megatron_actor import MegatronActor

        return RoleSpec(MegatronActor, {"cfg": actor}, mp_size=actor.megatron.tp * actor.megatron.pp)
    # a sequence-parallel group shares rows
    return RoleSpec(FSDPActor, {"cfg": actor, "exact": exact}, mp_size=actor.ulysses_sp)


def critic_spec(critic: CriticConfig) -> RoleSpec:
    """The critic's role on its training engine (a Megatron model replica's TP ranks share one chunk of rows)."""
    if critic.strategy == "megatron":
        from core.train.megatron_critic import MegatronCritic

        return RoleSpec(MegatronCritic, {"cfg": critic}, mp_size=critic.megatron.tp)
    return RoleSpec(FSDPCritic, {"cfg": critic})


def role_specs(cfg: RunConfig) -> dict[str, RoleSpec]:
    """The worker class and arguments of every role the run has."""
    specs = {"actor": policy_spec(cfg.actor, exact=cfg.rollout.exact_logprobs),
             # a tensor-parallel engine's replica spans tensor_parallel_size ranks: they share one chunk of prompts
             "rollout": RoleSpec(RolloutWorker, {"cfg": cfg.rollout,
                                                 "max_response_length": max(cfg.algo.sampling.max_new_tokens,
                                                                            cfg.algo.val_sampling.max_new_tokens,
                                                                            cfg.rollout.agent.max_response_tokens
                                                                            if cfg.rollout.agent.enable else 0)},
                                 mp_size=cfg.rollout.tensor_parallel_size)}
    if cfg.has_reference():
        specs["ref"] = (policy_spec(reference_config(cfg.actor)) if not cfg.actor.lora.rank
                        else RoleSpec(LoraReference, mp_size=cfg.actor.ulysses_sp))  # the actor's forward: its groups
    if cfg.use_critic:
        specs["critic"] = critic_spec(cfg.critic)
    if cfg.use_reward_model:
        specs["reward_model"] = RoleSpec(RewardModelWorker, {"cfg": cfg.reward_model, "policy_model": cfg.actor.model})
    if cfg.implicit_prm.enable:  # PRIME's implicit PRM: a policy on the FSDP engine whose loss is implicit_prm
        specs["prm"] = policy_spec(prm_actor_config(cfg))
    if cfg.teacher.model:  # on-policy distillation: a frozen policy of its own model, scoring the student's tokens
        specs["teacher"] = policy_spec(teacher_config(cfg.actor, cfg.teacher))
    return specs


def sync_across_pools(actor: RoleGroup, rollout: RoleGroup, timeout_s: float | None = None) -> dict:
    """Actor pool -> rollout pool, bucket by bucket through the controller (buckets of the rollout config's
    ``sync_bucket_megabytes``); returns the colocated sync's metrics keys but memory, which is per process."""
    t0 = time.perf_counter()
    names, dtype, bucket_bytes, changed_only = rollout.call_rank0(RolloutWorker.sync_spec, timeout_s=timeout_s)
    plan = actor.call_rank0(PolicyWorker.bucket_plan, bucket_bytes, changed_only, timeout_s=timeout_s)
    missing = sorted(set(names) - {n for bucket in plan for n in bucket}) if names and not changed_only else []
    if missing:
        raise WeightSyncError(f"rollout weights the actor does not have: {missing[:5]}"
                              f"{'...' if len(missing) > 5 else ''}")
    sent, peak = 0, 0
    for bucket_names in plan:
        bucket = actor.call_all(PolicyWorker.gather_bucket, bucket_names, dtype, timeout_s=timeout_s)[0]
        size = rollout.call_all(RolloutWorker.load_weights, bucket, timeout_s=timeout_s)[0]
        sent, peak = sent + size, max(peak, size)
        del bucket
    rollout.call_all(RolloutWorker.finish_sync, timeout_s=timeout_s)
    return {"sync/seconds": time.perf_counter() - t0, "sync/megabytes": sent / 2**20, "sync/buckets": len(plan),
            "sync/peak_bucket_megabytes": peak / 2**20}
