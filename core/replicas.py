"""Rollout replicas that may be lost: the rollout role on a pool of its own, driven so that a replica whose process
dies (killed, OOM, a node gone), or whose vLLM engine dies under it, costs its work, not the run.

The rollout's data-parallel replicas (``tensor_parallel_size`` ranks each) share no collective: each holds the
weights the controller sends it and samples its rows. ``RolloutReplicas`` has ``RoleGroup``'s dispatch calls; when
a replica's process dies during one, it is dropped (not restarted: its slots stay empty until the run is started
again, e.g. resumed from a checkpoint), the log says which and where, its rows go to the replicas left, and the
run goes on:

    replicas = RolloutReplicas(placement["rollout"], min_replicas=1)
    batch = replicas.dp_split(RolloutWorker.generate, prompts, sampling)   # a chunk lost mid-call runs elsewhere

A row's samples are seeded by its index in the whole batch (``prompt_index``, which ``dp_split`` adds), not by the
replica that draws them: a chunk re-run on another replica draws the samples the lost one would have. The run
stops (``WorkerDiedError``, resumable from the last checkpoint) when fewer than ``min_replicas`` are left.

Colocated placement (the rollout in the actor's processes) is not wrapped: a rollout rank that dies takes an actor
rank with it, and the actor's FSDP world cannot lose a rank -- that stops the run as before.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from core.protocol import Batch
from core.worker_group import Pending, RoleGroup, WorkerDiedError, WorkerError, _merge, _method_name

# a rank alive whose engine is not: vLLM's engine-core process died (killed, out of memory); the rank is ended too
ENGINE_LOST = ("EngineDeadError",)


class RolloutReplicas:
    """The rollout role's replicas, those alive and those lost, with ``RoleGroup``'s dispatch calls."""

    def __init__(self, role: RoleGroup, min_replicas: int = 1, log: Callable[[str], None] = print):
        self.role, self.group, self.name, self.spec, self.mp_size = role, role.group, role.name, role.spec, role.mp_size
        self.min_replicas, self.log = min_replicas, log
        self.live = list(range(role.dp_size))   # replica indices, each mp_size consecutive ranks
        self.replicas_lost = 0                  # since the run (this process) started
        self.requeued = 0                       # rows run again on another replica, since the last ``metrics()``

    @property
    def dp_size(self) -> int:
        return len(self.live)

    @property
    def world_size(self) -> int:
        return len(self.live) * self.mp_size

    def ranks(self, replica: int) -> list[int]:
        return list(range(replica * self.mp_size, (replica + 1) * self.mp_size))

    def metrics(self) -> dict[str, float]:
        """``rollout/replicas_lost`` (so far) and ``rollout/groups_requeued`` (prompt rows run again since the last
        call: once a step)."""
        out = {"rollout/replicas_lost": float(self.replicas_lost), "rollout/groups_requeued": float(self.requeued)}
        self.requeued = 0
        return out

    # ---------------------------------------------------------------------------------------------- dispatch
    def call_all(self, method: Callable, *args, timeout_s: float | None = None, **kwargs) -> list[Any]:
        """Every live rank runs it; results in rank order, those of a replica lost during the call left out."""
        return self.call_each(method, [args] * self.world_size, timeout_s, **kwargs)

    def call_each(self, method: Callable, per_rank: list[tuple], timeout_s: float | None = None,
                  **kwargs) -> list[Any]:
        """Live rank i (in rank order) runs ``method(*per_rank[i])``; a replica lost during the call is left out."""
        name = _method_name(self.name, self.spec.cls, method)
        if len(per_rank) != self.world_size:
            raise ValueError(f"role {self.name!r}: {len(per_rank)} argument tuples for {self.world_size} live ranks")
        calls = {r: per_rank[i * self.mp_size:(i + 1) * self.mp_size] for i, r in enumerate(self.live)}
        waits = {r: self._submit(r, name, [(a, kwargs) for a in calls[r]], timeout_s) for r in self.live}
        out = []
        for r, wait in waits.items():
            try:
                out += wait()
            except WorkerError as e:
                self._lose(r, self._gone(e), rows=0)
        return out

    def call_rank0(self, method: Callable, *args, timeout_s: float | None = None, **kwargs) -> Any:
        """The first live replica's first rank runs it; another if that one is lost meanwhile."""
        name = _method_name(self.name, self.spec.cls, method)
        while True:
            r = self._first_live()
            try:
                return self._submit(r, name, [(args, kwargs)], timeout_s, ranks=[r * self.mp_size])()[0]
            except WorkerError as e:
                self._lose(r, self._gone(e), rows=0)

    def dp_split(self, method: Callable, batch: Batch, *args, **kwargs) -> Any:
        return self.dp_split_async(method, batch, *args, **kwargs)()

    def dp_split_async(self, method: Callable, batch: Batch, *args, **kwargs) -> Pending:
        """``RoleGroup.dp_split_async`` over the live replicas; a chunk whose replica is lost runs again on the next
        live one (its rows keep their ``prompt_index``, so their samples are the same)."""
        name = _method_name(self.name, self.spec.cls, method)
        prompts = "responses" not in batch  # prompt rows (generate, stream_add), not samples (decode)
        if prompts and "prompt_index" not in batch:
            batch = batch.union(Batch({"prompt_index": torch.arange(len(batch))}))
        live = list(self.live)
        padded, pad = batch.pad_to_multiple(len(live))
        chunks = padded.chunk(len(live))
        jobs = [(r, chunk, self._submit(r, name, [((chunk, *args), kwargs)] * self.mp_size))
                for r, chunk in zip(live, chunks)]

        def wait():
            out = []
            for i, (r, chunk, result) in enumerate(jobs):
                # the chunk's rows of the batch (the padding repeats rows: not re-queued work)
                real = max(0, min(len(chunk), len(batch) - i * len(chunk))) if prompts else 0
                while True:
                    try:
                        out.append(result()[0])
                        break
                    except WorkerError as e:
                        self._lose(r, self._gone(e), rows=real)
                        r = self._first_live()
                        result = self._submit(r, name, [((chunk, *args), kwargs)] * self.mp_size)
            return _merge(out, pad)

        return Pending(wait, lambda: all(result.ready() for _, _, result in jobs))

    # ---------------------------------------------------------------------------------------------- inside
    def _submit(self, replica: int, name: str, calls: list[tuple[tuple, dict]], timeout_s: float | None = None,
                ranks: list[int] | None = None) -> Pending:
        return self.group.submit(self.name, name, ranks or self.ranks(replica), calls, timeout_s)

    def _first_live(self) -> int:
        return self.live[0]

    def _gone(self, error: WorkerError) -> WorkerError:
        """``error`` when it says the replica is gone (its process died, or its engine's: then its process is ended
        here), else raised on: any other failure stops the run as before."""
        if isinstance(error, WorkerDiedError):
            return error
        if error.detail.startswith(ENGINE_LOST):
            self.group.kill(error.rank)
            return error
        raise error

    def _lose(self, replica: int, error: WorkerError, rows: int) -> None:
        """Drop ``replica`` (its process died: ``error``); stop the run if too few are left."""
        if replica in self.live:
            self.live.remove(replica)
            self.replicas_lost += 1
            self.group.lost.update(self.ranks(replica))
        self.requeued += rows
        left = f"{len(self.live)} of {len(self.live) + self.replicas_lost} rollout replicas left"
        if len(self.live) < self.min_replicas:
            raise WorkerDiedError(error.role, error.rank, error.method, f"{error.detail}; {left}, fewer than "
                                  f"rollout.min_replicas={self.min_replicas}") from error
        again = f", its {rows} prompt row(s) re-queued on replica {self.live[0]}" if rows else ""
        self.log(f"rollout replica {replica} (rank {error.rank}) lost in {error.method}: {error.detail}{again}; "
                 f"{left}, the run goes on")
