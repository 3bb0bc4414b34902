"""The roles of a run: which worker class runs each (``role_specs``: the actor and its frozen reference on their
training engine, the rollout engine, the critic, the reward model, the implicit PRM, the distillation teacher), and the weight sync between
pools (with the rollout on a pool of its own the controller moves the actor's weights to it bucket by bucket;
colocated, each process syncs itself: ``core.rollout.worker.RolloutWorker.sync_weights``)."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Callable

from core.config import ActorConfig, CriticConfig, LoraConfig, PolicyLossConfig, RunConfig, TeacherConfig
from core.rollout.weight_sync import SyncSpec, SyncStats, WeightSyncError, due_check
from core.rollout.worker import RolloutWorker
from core.train.critic import FSDPCritic
from core.train.fsdp import FSDPActor
from core.train.lora import LoraReference
from core.train.policy import PolicyWorker
from core.train.reward_model import RewardModelWorker
from core.worker import RoleSpec
from core.weight_delta import Bucket
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


def sync_across_pools(actor: RoleGroup, rollout: RoleGroup, timeout_s: float | None = None,
                      transit: Callable[[list[Bucket]], list[Bucket]] | None = None, full: bool = False) -> dict:
    """Actor pool -> rollout pool, bucket by bucket through the controller (buckets of the rollout config's
    ``sync_bucket_megabytes``); returns the colocated sync's metrics keys but memory, which is per process.

    Unless ``rollout.sync_delta=never`` (an FSDP actor without LoRA) each actor rank sends its own shard of each
    bucket, as a delta against what every rollout rank holds where they all hold the same sync (``core.weight_delta``);
    a bucket that fails its checks, or a digest that differs from the trainer's (every ``sync_hash_every`` delta
    syncs), is logged and every weight is sent again. ``transit``: what the link does to each bucket on its way
    (tests flip a byte in it); ``full``: every weight, as values."""
    specs = rollout.call_all(RolloutWorker.sync_spec, timeout_s=timeout_s)
    spec = specs[0]
    if not (spec.delta and actor.call_rank0(PolicyWorker.sends_shards, timeout_s=timeout_s)):
        return _sync_gathered(actor, rollout, spec, timeout_s) | {"sync/full": 1.0}
    base = spec.holds if len({s.holds for s in specs}) == 1 and not full else None
    metrics, sync_id, problem = _sync_shards(actor, rollout, spec, base, spec.changed_only and not full, timeout_s,
                                             transit)
    checked = not problem and base is not None and due_check(spec.unchecked + 1, spec.hash_every)
    if checked:
        problem, metrics["sync/hash_checked"] = _digests_differ(actor, rollout, spec, timeout_s), 1.0
    resyncs = 0
    if problem:
        print(f"weight sync: {problem}; sending every weight again (full resync)", flush=True)
        metrics, sync_id, problem = _sync_shards(actor, rollout, spec, None, False, timeout_s, None)
        if problem:
            raise WeightSyncError(f"full resync: {problem}")
        resyncs = 1
    counts = metrics["sync/full"] == 0.0 and not checked  # a delta not yet covered by a digest comparison
    rollout.call_all(RolloutWorker.finish_sync, sync_id, counts, timeout_s=timeout_s)
    return metrics | {"sync/resyncs": float(resyncs)}


def check_across_pools(actor: RoleGroup, rollout: RoleGroup, timeout_s: float | None = None) -> dict:
    """The rollout pool's weight digest against the trainer's (at a checkpoint); a mismatch is logged and every
    weight sent again. Nothing to compare unless delta syncs are on."""
    spec = rollout.call_rank0(RolloutWorker.sync_spec, timeout_s=timeout_s)
    if not (spec.delta and spec.holds and actor.call_rank0(PolicyWorker.sends_shards, timeout_s=timeout_s)):
        return {}
    problem = _digests_differ(actor, rollout, spec, timeout_s)
    if not problem:
        return {"sync/hash_checked": 1.0}
    print(f"weight sync: {problem}; sending every weight again (full resync)", flush=True)
    return sync_across_pools(actor, rollout, timeout_s, full=True) | {"sync/hash_checked": 1.0, "sync/resyncs": 1.0}


def _sync_shards(actor: RoleGroup, rollout: RoleGroup, spec: SyncSpec, base: str | None, changed_only: bool,
                 timeout_s: float | None, transit) -> tuple[dict, str, str | None]:
    """Every bucket of the plan from every actor rank's shard to every rollout rank: (metrics, the sync's id, the
    first problem a rollout rank found, which stops it). On Ray a bucket goes from the actor ranks' object stores to
    the rollout ranks without passing through the driver, and the actor encodes the next bucket while the rollout
    loads this one (at most two in flight)."""
    t0, stats, sync_id = time.perf_counter(), SyncStats(), uuid.uuid4().hex
    plan = actor.call_rank0(PolicyWorker.bucket_plan, spec.bucket_bytes, changed_only, timeout_s=timeout_s)
    _check_covers(spec, plan, changed_only)
    encode = lambda names: actor.call_all_async(PolicyWorker.shard_bucket, names, spec.dtype, base, sync_id,  # noqa: E731
                                                timeout_s=timeout_s)
    upcoming = encode(plan[0]) if plan else None
    for i in range(len(plan)):
        pending, upcoming = upcoming, encode(plan[i + 1]) if i + 1 < len(plan) else None
        buckets = pending.refs if transit is None and pending.refs is not None else pending()
        if transit is not None:
            buckets = transit(buckets)
        loads = rollout.call_all(RolloutWorker.load_buckets, *buckets, timeout_s=timeout_s)
        problems = [r.problem for r in loads if r.problem]
        if problems:
            if upcoming is not None:
                upcoming()  # let the encode in flight end before the next sync's
            return {}, sync_id, problems[0]
        stats.add(loads[0])
    return stats.metrics(time.perf_counter() - t0, base is not None), sync_id, None


def _digests_differ(actor: RoleGroup, rollout: RoleGroup, spec: SyncSpec, timeout_s: float | None) -> str | None:
    names = [n for b in actor.call_rank0(PolicyWorker.bucket_plan, spec.bucket_bytes, timeout_s=timeout_s) for n in b]
    trainer = actor.call_all(PolicyWorker.weights_sha256, spec.dtype, timeout_s=timeout_s)[0]
    engines = rollout.call_all(RolloutWorker.weights_sha256, names, timeout_s=timeout_s)
    wrong = [r for r, d in enumerate(engines) if d != trainer]
    return (f"rollout rank {wrong[0]}'s weight digest {engines[wrong[0]][:12]} differs from the trainer's "
            f"{trainer[:12]}" if wrong else None)


def _check_covers(spec: SyncSpec, plan: list[list[str]], changed_only: bool) -> None:
    missing = sorted(set(spec.names) - {n for bucket in plan for n in bucket}) if spec.names and not changed_only else []
    if missing:
        raise WeightSyncError(f"rollout weights the actor does not have: {missing[:5]}"
                              f"{'...' if len(missing) > 5 else ''}")


def _sync_gathered(actor: RoleGroup, rollout: RoleGroup, spec: SyncSpec, timeout_s: float | None) -> dict:
    """Full tensors, each bucket gathered on actor rank 0 (a LoRA actor's merged weights, Megatron's)."""
    t0 = time.perf_counter()
    plan = actor.call_rank0(PolicyWorker.bucket_plan, spec.bucket_bytes, spec.changed_only, timeout_s=timeout_s)
    _check_covers(spec, plan, spec.changed_only)
    sent, peak = 0, 0
    for bucket_names in plan:
        bucket = actor.call_all(PolicyWorker.gather_bucket, bucket_names, spec.dtype, timeout_s=timeout_s)[0]
        size = rollout.call_all(RolloutWorker.load_weights, bucket, timeout_s=timeout_s)[0]
        sent, peak = sent + size, max(peak, size)
        del bucket
    rollout.call_all(RolloutWorker.finish_sync, timeout_s=timeout_s)
    return {"sync/seconds": time.perf_counter() - t0, "sync/megabytes": sent / 2**20, "sync/buckets": len(plan),
            "sync/peak_bucket_megabytes": peak / 2**20}
