"""Weight sync between pools: with the rollout on a pool of its own, the controller moves the actor's weights to
it bucket by bucket (colocated, each process syncs itself: ``core.rollout.worker.RolloutWorker.sync_weights``)."""

from __future__ import annotations

import time

from core.rollout.weight_sync import WeightSyncError
from core.rollout.worker import RolloutWorker
from core.train.policy import PolicyWorker
from core.worker_group import RoleGroup


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
