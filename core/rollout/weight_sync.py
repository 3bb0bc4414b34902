"""Weight sync: the actor's FSDP2 shards -> the rollout engine's full weights, one bucket at a time.

Colocated (actor and rollout on one pool, so in one process per rank): ``sync_weights`` runs on every rank.

Each bucket is all-gathered (every rank iterates the same buckets in the same order), copied in by the engine
(which checks names and shapes; dtypes are cast to the engine's), and dropped before the next one is gathered,
so at most one bucket of full tensors exists beside the engine's own weights. ``debug=True`` also compares a
checksum of every tensor after the copy. The metrics include the peak memory above the level before the sync
(device memory on CUDA, RSS on CPU) and what is left after it. A peer that never joins a gather stalls the
collective: the controller bounds the call (``AlgoConfig.sync_timeout_s``) and raises ``WorkerTimeoutError``.

Split (the rollout on a pool of its own): ``core.roles.sync_across_pools`` runs in the controller. Per bucket,
the actor ranks gather it together and rank 0 returns it cast to the engine's dtype; every rollout rank then
copies it in. The bucket travels through Ray's object store; at most one bucket is in flight.

The first sync sends every weight; later ones only the weights an update can change (a LoRA actor's adapted
linears: its frozen embedding and norms are already there). This module holds
the in-process mechanics only, so it imports no role (the roles import it).
"""

from __future__ import annotations

import time
from typing import Iterator, Protocol

import torch

from core.memory import peak_memory
from core.rollout.engine import RolloutEngine


class WeightSource(Protocol):
    """The actor's side of a sync (``core.train.policy.PolicyWorker``, whatever engine holds its weights)."""

    def weight_buckets(self, bucket_bytes: int, changed_only: bool = False
                       ) -> Iterator[list[tuple[str, torch.Tensor]]]: ...


class WeightSyncError(RuntimeError):
    pass


def sync_weights(actor: WeightSource, engine: RolloutEngine, bucket_bytes: int = 64 << 20, debug: bool = False,
                 changed_only: bool = False) -> dict:
    """Copy the actor's current weights into ``engine``; returns timing, size and peak-bucket metrics.
    ``changed_only``: the engine already holds every weight from an earlier sync, so only those an update can
    change are sent (``PolicyWorker.bucket_plan``)."""
    with peak_memory(engine.device) as mem:
        metrics = _sync(actor, engine, bucket_bytes, debug, changed_only)
    return metrics | {"sync/peak_memory_megabytes": mem.peak_bytes / 2**20,
                      "sync/retained_memory_megabytes": mem.end_bytes / 2**20}


def _sync(actor: WeightSource, engine: RolloutEngine, bucket_bytes: int, debug: bool, changed_only: bool) -> dict:
    t0 = time.perf_counter()
    # None: the engine maps names itself (vLLM fuses q/k/v and gate/up; its load_weights rejects unknown names)
    targets = engine.weight_names()
    sent, buckets, peak, seen = 0, 0, 0, set()
    for bucket in actor.weight_buckets(bucket_bytes, changed_only):
        # the engine checks every name and shape as it copies (KeyError / ValueError naming the weight) and casts
        # to its dtype inside the copy (a separate .to() first was one more pass and allocation per bucket)
        size = engine.update_weights(bucket)
        if debug:
            try:
                engine.verify_weights(bucket)
            except ValueError as e:
                raise WeightSyncError(f"bucket {buckets}: {e}") from e
        seen.update(n for n, _ in bucket)
        sent, buckets, peak = sent + size, buckets + 1, max(peak, size)
        del bucket
    engine.finish_update()  # vLLM holds a bucket's trailing layer until the rest of it comes
    missing = sorted(set(targets) - seen) if targets is not None and not changed_only else []
    if missing:
        raise WeightSyncError(f"rollout weights not sent by the actor: {missing[:5]}"
                              f"{'...' if len(missing) > 5 else ''}")
    return {"sync/seconds": time.perf_counter() - t0, "sync/megabytes": sent / 2**20, "sync/buckets": buckets,
            "sync/peak_bucket_megabytes": peak / 2**20}
