"""Streaming RL (``trainer.async.mode: streaming``): the rollout generates continuously into a buffer of finished
prompt groups; the trainer takes a batch as soon as enough groups are ready; each weight sync lands between two
decode steps, and the sequences in flight go on under the new weights (partial rollouts: each token carries the
version that drew it, ``rollout_versions``). The rollout ranks' side: ``core.rollout.stream``.

Versions count updates: the trainer's step k trains policy v = k - 1 (into v + 1); a sample's ``staleness`` is v
minus the version of its oldest token. With ``max_staleness`` s:

* **admission**: a group is queued only while the groups admitted (and not dropped) are fewer than
  (v + s + 1) x B (B = ``data.prompts_per_step``): the groups steps up to v + s + 1 take. Nothing is generated that
  the bound would forbid if groups were taken in order; s = 0 admits only step k's groups, after the sync of v:
  the synchronous run exactly (``tests/loop/test_streaming.py``). A step that takes more (DAPO's redraws) gets
  fresh groups on demand, and the next steps' s batches are sized at the rate the last step took.
* **take**: the B finished groups with the oldest first tokens (then the earliest admitted), in admission order.
  A long response does not hold the step: it goes on into a later step's batch.
* **the bound**: ``on_stale: drop`` drops a group, finished or in flight (aborted on its rank), as soon as the
  next version would put it over s (``rollout/stale_dropped``); ``wait`` makes the take wait for every group whose
  bound ends at this step, so none is dropped.

While the trainer computes (old log-probs, reference, update), the rollout goes on, admitting up to the bound:
``trainer.async.overlap_steps`` decode steps per phase, or (0) as many as the phase's time allows. A take admits only
what it lacks (groups for later steps would share its decode steps and slow it). With the rollout on the actor's pool (colocated) the calls run one after another on the same
processes -- time-sliced: nothing overlaps, but a step still takes the first B groups to finish and the long tail
carries over. The rollout's KV cache stays allocated across the update then.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch

from core.config import SamplingParams
from core.protocol import Batch
from core.rollout.stream import versions_tensor
from core.rollout.worker import RolloutWorker
from core.worker_group import Pending, RoleGroup


FILE = "rollout_stream.pt"  # in a checkpoint: the stream's state (``RolloutStream.save``)


@dataclass
class Group:
    """A prompt row admitted to the stream: its row (non-tensor columns), the sampling seed of the batch it was
    drawn in and its index there (its samples' seeds), the version of its first token once started, its samples
    once finished."""
    row: Batch
    seed: int
    index: int
    oldest: int | None = None
    samples: Batch | None = None


class RolloutStream:
    """The driver's side of the stream: admission, the buffer, the take, the staleness bound, the overlap."""

    def __init__(self, rollout: RoleGroup, draw: Callable[[], Batch], per_step: int, base_seed: int,
                 max_staleness: int, on_stale: str, chunk_steps: int, overlap_steps: int, recompute_kv: bool = True,
                 version: int = 0):
        self.rollout, self._draw, self.B, self.base_seed = rollout, draw, per_step, base_seed
        self.recompute_kv = recompute_kv
        self.s, self.on_stale, self.chunk, self.overlap_steps = max_staleness, on_stale, chunk_steps, overlap_steps
        self.version = version                   # weight versions the rollout has taken (syncs)
        self.groups: dict[int, Group] = {}       # admitted, not yet taken or dropped, by key (admission order)
        self.waiting: list[Group] = []           # drawn, not yet admitted
        self.next_key = self.draws = self.counted = 0  # keys handed out; batches drawn; admitted and not dropped
        self.taken = self.taken_before = 0       # groups taken in all; and before this version
        self.rate = per_step                     # groups the last version's step took
        self.dropped = 0                         # since the last take
        self.lost_seen = 0                       # rollout replicas lost so far, their groups re-queued
        self.sampling: SamplingParams | None = None

    # ------------------------------------------------------------------------------------------ the step's calls
    def draw(self) -> Batch:
        """What a step's ``draw()`` returns: no prompts of its own -- ``take`` hands out the stream's next groups."""
        return Batch(meta={"stream_groups": self.B})

    def take(self, sampling: SamplingParams) -> Batch:
        """The next batch: B finished groups (the rollout runs until there are), with ``policy_version`` and
        ``staleness`` per sample and ``rollout_versions`` per token; the stream's counters in ``meta``."""
        base = replace(sampling, seed=0)
        if self.sampling is None:
            self.sampling = base
        elif base != self.sampling:
            raise ValueError(f"trainer.async.mode=streaming samples with one set of parameters: {self.sampling} "
                             f"(seed aside), then {sampling}")
        while (picked := self._pick()) is None:
            # only what this take lacks: groups for later steps would slow this one's (they share the decode steps);
            # those start while the trainer computes (``overlap``). DAPO's redraws: fresh groups, beyond the bound
            need = self.B - len(self.groups)
            self._admit(at_most=need, at_least=0 if self._busy() else need)
            if not self._busy():
                raise RuntimeError(f"the rollout stream stalled: {len(self.groups)} groups admitted, none in flight "
                                   f"and fewer than {self.B} ready")
            self._advance(self.chunk)
        self.taken += len(picked)
        batch = Batch.concat([self._samples(key) for key in sorted(picked)])
        batch["policy_version"] = versions_tensor(batch)
        batch["staleness"] = self.version - batch["policy_version"]
        buffered = sum(g.samples is not None for g in self.groups.values())
        batch.meta["stream"] = {"rollout/stale_dropped": float(self.dropped),
                                "rollout/buffered_groups": float(buffered),
                                "rollout/in_flight_groups": float(len(self.groups) - buffered)}
        self.dropped = 0
        return batch

    def overlap(self, update: Pending):
        """``update``'s result (a trainer phase's calls: old log-probs, reference, update), the rollout decoding
        meanwhile, up to the bound (``overlap_steps``, or until the calls end)."""
        self._admit()
        if self.overlap_steps:
            left = self.overlap_steps
            while left > 0 and self._busy():
                self._advance(min(self.chunk, left))
                left -= self.chunk
        else:
            while not update.ready() and self._busy():
                self._advance(self.chunk)
        return update()

    def synced(self) -> None:
        """After a weight sync: the rollout holds one more version (its ranks recompute the in-flight sequences'
        KV); with ``on_stale: drop``, the groups the new version puts over the bound go now."""
        self.version += 1
        self.rate, self.taken_before = max(self.B, self.taken - self.taken_before), self.taken
        if self.on_stale == "drop":
            gone = {k for k, g in self.groups.items() if g.oldest is not None and g.oldest < self.version - self.s}
            in_flight = [k for k in gone if self.groups[k].samples is None]
            if in_flight:
                self.rollout.call_all(RolloutWorker.stream_abort, in_flight)
            for k in gone:
                del self.groups[k]
            self.counted -= len(gone)
            self.dropped += len(gone)

    # ------------------------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The driver's side (groups admitted, the buffer, prompts drawn ahead, counters) and every rollout rank's
        stream: its sequences in flight, their tokens and versions (``RolloutWorker.stream_state``)."""
        mine = {k: getattr(self, k) for k in ("version", "groups", "waiting", "next_key", "draws", "counted",
                                              "dropped", "sampling", "taken", "taken_before", "rate")}
        return {"driver": mine, "ranks": self.rollout.call_all(RolloutWorker.stream_state)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state["driver"].items():
            setattr(self, key, value)
        ranks = state["ranks"]
        if len(ranks) > self.rollout.world_size:
            raise ValueError(f"the checkpoint's stream has {len(ranks)} rollout ranks, this run {self.rollout.world_size}: "
                             "resume a streaming run on the same rollout layout")
        # each rank its own; a run saved after losing replicas has fewer: the ranks past them start empty
        ranks = ranks + [None] * (self.rollout.world_size - len(ranks))
        self.rollout.call_each(RolloutWorker.stream_load, [(part,) for part in ranks])

    def save(self, folder: Path) -> None:
        torch.save(self.state_dict(), folder / FILE)

    def restore(self, folder: Path) -> None:
        """From a checkpoint's folder, after the rollout holds its weights (the run resumed syncs them first)."""
        self.load_state_dict(torch.load(folder / FILE, weights_only=False))

    # ------------------------------------------------------------------------------------------ inside
    def _pick(self) -> list[int] | None:
        """The keys of the batch to take now, or None while it is not there yet."""
        v, bound = self.version, self.version - self.s
        started = {k: (g.oldest if g.oldest is not None else v) for k, g in self.groups.items()}
        if self.on_stale == "wait":
            if any(self.groups[k].samples is None for k, o in started.items() if o <= bound):
                return None  # a group whose bound ends at this step is still in flight
        ready = sorted((started[k], k) for k, g in self.groups.items() if g.samples is not None)
        must = sum(o <= bound for o, _ in ready)
        picked = [k for _, k in ready[:max(self.B, must)]]
        return picked if len(picked) >= self.B else None

    def _room(self) -> int:
        """Groups the bound lets in now: this step's B and s more steps' worth (at the rate the last step took:
        B, more with DAPO's redraws), beyond those taken before this version, less those admitted (not dropped).
        Taking B a step, that is (v + s + 1) x B admitted in all."""
        return self.taken_before + self.B + self.s * self.rate - self.counted

    def _busy(self) -> bool:
        return any(g.samples is None for g in self.groups.values())

    def _admit(self, at_most: int | None = None, at_least: int = 0) -> None:
        """Queue groups on the rollout while the staleness bound allows (no more than ``at_most``; at least
        ``at_least``, which a take waits for: they start at the current version), in whole shares for its
        replicas."""
        dp, room = self.rollout.dp_size, self._room() if at_most is None else min(self._room(), at_most)
        room = max(room - room % dp, -(-at_least // dp) * dp)
        if room <= 0:
            return
        while len(self.waiting) < room:
            rows, seed = self._draw(), self.base_seed + self.draws
            self.draws += 1
            self.waiting += [Group(rows.index([i]), seed, i) for i in range(len(rows))]
        admit, self.waiting = self.waiting[:room], self.waiting[room:]
        keys = list(range(self.next_key, self.next_key + len(admit)))
        self.next_key += len(admit)
        self.counted += len(admit)
        for key, g in zip(keys, admit):
            self.groups[key] = g
        self._queue(keys)

    def _queue(self, keys: list[int]) -> None:
        """Queue these admitted groups on the rollout: each replica a consecutive share (the first ones one more
        when they do not divide), each row's samples seeded as ``generate`` seeds them (its batch's seed, its row
        there)."""
        rows = Batch.concat([self.groups[k].row for k in keys])
        rows["stream_key"], rows["stream_seed"] = keys, [self.groups[k].seed for k in keys]
        rows["stream_index"] = [self.groups[k].index for k in keys]
        dp, cuts = self.rollout.dp_size, [0]
        for i in range(dp):
            cuts.append(cuts[-1] + len(keys) // dp + (i < len(keys) % dp))
        shares = [(rows.index(slice(cuts[i], cuts[i + 1])), self.sampling, self.recompute_kv) for i in range(dp)]
        self.rollout.call_each(RolloutWorker.stream_add, [shares[r // self.rollout.mp_size]
                                                          for r in range(self.rollout.world_size)])

    def _advance(self, steps: int) -> None:
        """``steps`` decode steps on every rollout rank; the groups that started and finished recorded."""
        for finished, started in self.rollout.call_all(RolloutWorker.stream_step, steps)[::self.rollout.mp_size]:
            for key, version in started.items():
                if key in self.groups:
                    self.groups[key].oldest = version
            if finished is None:
                continue
            keys = list(finished["stream_key"])
            for key in dict.fromkeys(keys):
                if key in self.groups:
                    self.groups[key].samples = finished.index([b for b, k in enumerate(keys) if k == key])
        if getattr(self.rollout, "replicas_lost", 0) != self.lost_seen:  # a replica lost (core.replicas)
            self.lost_seen = self.rollout.replicas_lost
            self._requeue_lost()

    def _requeue_lost(self) -> None:
        """After a rollout replica was lost (``core.replicas``): the groups it held, queued or in flight, start again
        on the replicas left -- from their first token, at the current version, with their own seeds."""
        held = {k for keys in self.rollout.call_all(RolloutWorker.stream_keys) for k in keys}
        lost = [k for k, g in self.groups.items() if g.samples is None and k not in held]
        if not lost:
            return
        for k in lost:
            self.groups[k].oldest = None
        self._queue(lost)
        self.rollout.requeued += len(lost)

    def _samples(self, key: int) -> Batch:
        """A taken group's samples with its row's columns (each prompt group's ``uid`` is its key)."""
        g = self.groups.pop(key)
        n = len(g.samples)
        rows = g.row.repeat(n).non_tensors
        rows["uid"] = [f"s{key}"] * n
        return Batch({k: v for k, v in g.samples.tensors.items()}, rows)
