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
linears: its frozen embedding and norms are already there).

Delta syncs (``rollout.sync_delta``: by default where the sync crosses pools; an FSDP actor without LoRA): each
actor rank encodes its own shard of each weight against what the receiver holds (``core.weight_delta``: only the
changed bits travel) and no rank gathers full tensors; ``DeltaReceiver`` checks each bucket's CRC and base and
writes the weights. A full sync (values) comes first, after a restart of either side, and after any check that
fails; every ``rollout.sync_hash_every`` delta syncs (and at every checkpoint) the receiver's weight digest is
compared with the trainer's.

This module holds the in-process mechanics only, so it imports no role (the roles import it).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

import torch

from core.memory import peak_memory
from core.determinism import weights_sha256
from core.rollout.engine import RolloutEngine
from core.weight_delta import Bucket, apply, checksum


class WeightSource(Protocol):
    """The actor's side of a sync (``core.train.policy.PolicyWorker``, whatever engine holds its weights)."""

    def weight_buckets(self, bucket_bytes: int, changed_only: bool = False
                       ) -> Iterator[list[tuple[str, torch.Tensor]]]: ...

    def bucket_plan(self, bucket_bytes: int, changed_only: bool = False) -> list[list[str]]: ...

    def sends_shards(self) -> bool: ...

    def shard_bucket(self, names: list[str], dtype: str, base: str | None, sync_id: str) -> Bucket: ...

    def weights_sha256(self, dtype: str | None = None) -> str: ...


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


@dataclass(frozen=True)
class SyncSpec:
    """What a sync from another pool must send (``core.rollout.worker.RolloutWorker.sync_spec``)."""
    names: list[str] | None     # the engine's weight names (None: the engine maps the actor's names itself)
    dtype: str                  # the engine's (weights travel cast to it)
    bucket_bytes: int
    changed_only: bool          # an earlier sync sent every weight: only those an update can change
    delta: bool                 # rollout.sync_delta is not never
    hash_every: int             # rollout.sync_hash_every
    holds: str | None           # the shard-bucket sync whose weights the engine holds
    unchecked: int              # delta syncs since the last digest comparison


def due_check(unchecked: int, every: int) -> bool:
    """Whether the digests are compared after this sync: ``every`` delta syncs (0: never here, at checkpoints)."""
    return every > 0 and unchecked >= every


def engine_dtype(engine) -> str:
    return str(engine.dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Loaded:
    """A bucket of a shard-bucket sync at the receiver (``DeltaReceiver.load``): what every actor rank's part
    carried -- bytes, values changed, values -- or the check that failed."""
    received: int = 0
    changed: int = 0
    total: int = 0
    problem: str | None = None


class DeltaReceiver:
    """The engine's side of shard-bucket syncs: which sync's weights it holds, and (for an engine whose weights
    cannot be read by name: vLLM, SGLang) a copy of the weights as last synced, the base its deltas apply to."""

    def __init__(self, engine):
        self.engine = engine
        self.holds: str | None = None   # the sync whose weights the engine holds (None: unknown, or none yet)
        self.mirror: dict[str, torch.Tensor] | None = None if hasattr(engine, "weight") else {}
        self.unchecked = 0              # delta syncs since the last digest comparison
        self.base: str | None = None    # during a sync: the sync the engine held when it began

    def load(self, buckets: list[Bucket]) -> Loaded:
        """Check every actor rank's bucket (CRC-32, base), then write each weight: its parts applied to a copy of
        what the engine holds, or to a new tensor when they are all values. Returns what the buckets carried, or
        the problem (a bucket that fails a check: nothing of it written, and the engine no longer holds any sync)."""
        if self.holds is not None:  # a sync begins: the engine is a mix of two syncs until finish()
            self.base, self.holds = self.holds, None
        for rank, b in enumerate(buckets):
            name = b.parts[0].name if b.parts else "-"
            problem = (f"actor rank {rank}'s bucket (from {name}) fails its CRC-32 check"
                       if checksum(b.parts) != b.crc else
                       f"actor rank {rank}'s delta (from {name}) is against sync {b.base}, not the engine's {self.base}"
                       if b.base is not None and b.base != self.base else None)
            if problem:
                self.base = None
                return Loaded(problem=problem)
        parts = defaultdict(list)
        for b in buckets:
            for p in b.parts:
                parts[p.name].append(p)
        for name, ps in parts.items():
            if all(p.k < 0 for p in ps) and sum(p.numel for p in ps) == math.prod(ps[0].shape):
                full = torch.empty(ps[0].shape, dtype=ps[0].values.dtype)
            else:
                full = (self.mirror[name] if self.mirror is not None else self.engine.weight(name)).clone()
            for p in ps:
                apply(p, full.view(-1))
            self.engine.update_weights([(name, full)])
            if self.mirror is not None:
                self.mirror[name] = full
        return Loaded(sum(b.nbytes for b in buckets), sum(b.changed for b in buckets), sum(b.total for b in buckets))

    def finish(self, sync_id: str | None, counts: bool) -> None:
        """The sync ``sync_id`` is complete; ``counts``: a delta sync no digest comparison has covered."""
        self.holds, self.base = sync_id, None
        self.unchecked = self.unchecked + 1 if counts else 0

    def sha256(self, names: list[str]) -> str:
        """The digest of the engine's weights ``names`` (``core.determinism.weights_sha256``, in this order), for a
        comparison with the trainer's: the count of delta syncs not covered by one starts again."""
        self.unchecked = 0
        get = self.mirror.__getitem__ if self.mirror is not None else self.engine.weight
        return weights_sha256([(n, get(n))] for n in names)


def sync_shards(actor: WeightSource, receiver: DeltaReceiver, bucket_bytes: int, changed_only: bool, delta: bool,
                sync_id: str, gather: Callable[[Bucket], list[Bucket]]) -> tuple[dict, str | None]:
    """A colocated shard-bucket sync on this rank (collective over the actor's ranks through ``gather``, which
    returns every rank's bucket): a delta against what the receiver holds when ``delta``, else values. Returns
    the metrics, or the problem that stopped it (the caller syncs again with ``delta`` false)."""
    t0, dtype = time.perf_counter(), engine_dtype(receiver.engine)
    stats, problem = SyncStats(), None
    base = receiver.holds if delta else None
    for names in actor.bucket_plan(bucket_bytes, changed_only):
        buckets = gather(actor.shard_bucket(names, dtype, base, sync_id))  # every rank, to the end: a collective
        loaded = receiver.load(buckets) if problem is None else None
        problem = problem or loaded.problem
        if problem is None:
            stats.add(loaded)
    if problem:
        return {}, problem
    receiver.engine.finish_update()
    receiver.finish(sync_id, base is not None)
    return stats.metrics(time.perf_counter() - t0, base is not None), None


class SyncStats:
    """What a shard-bucket sync sent: bytes, buckets, values changed of values sent."""

    def __init__(self):
        self.sent = self.buckets = self.peak = self.changed = self.total = 0

    def add(self, loaded: Loaded) -> None:
        self.sent, self.buckets = self.sent + loaded.received, self.buckets + 1
        self.peak = max(self.peak, loaded.received)
        self.changed, self.total = self.changed + loaded.changed, self.total + loaded.total

    def metrics(self, seconds: float, delta: bool) -> dict:
        return {"sync/seconds": seconds, "sync/megabytes": self.sent / 2**20, "sync/buckets": self.buckets,
                "sync/peak_bucket_megabytes": self.peak / 2**20, "sync/full": float(not delta),
                "sync/changed_fraction": self.changed / max(self.total, 1)}
