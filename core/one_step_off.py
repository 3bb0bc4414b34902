"""One-step-off-policy async training (``trainer.async.mode=one_step_off``): the rollout pool generates step k+1's
samples while the actor pool updates on step k's, from the weights before that update -- one version stale.

    v_k = the actor after k updates; the rollout holds v_(k-1) while step k trains
    step 1:  generate batch 1 (v0) | start batch 2 (v0) | update on batch 1: v0 -> v1 | wait for batch 2 | sync v1
    step 2:  take batch 2 (v0)     | start batch 3 (v1) | update on batch 2: v1 -> v2 | wait for batch 3 | sync v2

From step 2 on every sample is exactly one update behind the policy that trains on it (``rollout/staleness``,
per sample ``policy_version``); truncated importance sampling corrects for it (``algo.tis_cap``, 2 by default in
these runs). The generation and the next sync's weight loads go to the same Ray actors, which run calls in the
order they were made: a sync cannot land inside the generation before it. It needs the rollout on a pool of its
own (``core.checks``); on one pool the calls would queue behind each other and nothing would overlap.

``overlap: false`` keeps all of this but starts each generation after the sync (nothing stale): the synchronous
loop's metrics exactly (tests/loop/test_one_step_off.py) -- how to tell whether a divergence comes from the staleness.

``core.loop.generate`` and ``update`` use it when ``Roles.ahead`` is set (``core.trainer.fit``), so a recipe's
copy of the step runs one step off too. A step that generates more than once per step (DAPO's dynamic sampling)
cannot: the second generation asks for prompts that were not drawn ahead, and the step stops naming that.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch

from core.config import SamplingParams
from core.protocol import Batch
from core.rollout.worker import RolloutWorker
from core.worker_group import RoleGroup

FILE = "rollout_ahead.pt"  # in a checkpoint: the next step's samples, generated ahead


@dataclass
class Pending:
    """A generation started ahead: its prompts and sampling, the weight version it runs with, and its result (the
    function that waits for it until it is taken)."""

    prompts: Batch
    sampling: SamplingParams
    version: int
    result: Callable[[], Batch] | Batch
    drawn: bool = False  # the step's draw() has handed its prompts out

    def batch(self) -> Batch:
        if callable(self.result):
            self.result = self.result()
        return self.result


class RolloutAhead:
    """The rollout one step ahead of the actor. ``draw()``: the prompt stream; ``version``: the updates the
    rollout's weights hold (the number of syncs so far; the step number on resume)."""

    def __init__(self, rollout: RoleGroup, draw: Callable[[], Batch], overlap: bool = True, version: int = 0):
        self.rollout, self._draw, self.overlap, self.version = rollout, draw, overlap, version
        self.next: Pending | None = None
        self.sampling: SamplingParams | None = None  # the last step's, for the next one (seed + 1: ``fit``'s rule)

    def draw(self) -> Batch:
        """The step's prompts: those whose samples are being generated ahead, else the stream's next."""
        if self.next is not None and not self.next.drawn:
            self.next.drawn = True
            return self.next.prompts
        return self._draw()

    def take(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """The samples of ``prompts`` (generated ahead, or now on the first step), each tagged with the version
        that generated it and its staleness; with overlap, the next step's generation starts here."""
        pending, self.next, self.sampling = self.next, None, sampling
        if pending is None:
            pending = Pending(prompts, sampling, self.version, self._start(prompts, sampling))
        elif pending.prompts is not prompts or pending.sampling != sampling:
            raise RuntimeError("trainer.async.mode=one_step_off: this step generates for prompts or sampling other than "
                               "those generated ahead (the batch draw() returned, with the step's sampling seed + 1); "
                               "a step that generates more than once per step (e.g. DAPO's dynamic sampling) cannot "
                               "run one step off: set trainer.async.mode=streaming (its stream hands out more groups) or sync")
        batch = pending.batch()
        # decoded now, before the next generation occupies the rollout's processes (``core.loop.score`` reads it)
        batch = batch.union(self.rollout.dp_split(RolloutWorker.decode, batch))
        batch["policy_version"] = torch.full((len(batch),), float(pending.version))
        batch["rollout_versions"] = torch.full_like(batch["rollout_logprobs"], float(pending.version))
        batch["staleness"] = torch.full((len(batch),), float(self.version - pending.version))
        if self.overlap:
            self.start_next()
        return batch

    def start_next(self) -> None:
        """Draw the next step's prompts and start generating them with the rollout's weights as they are now."""
        sampling = replace(self.sampling, seed=self.sampling.seed + 1)
        prompts = self._draw()
        self.next = Pending(prompts, sampling, self.version, self._start(prompts, sampling))

    def _start(self, prompts: Batch, sampling: SamplingParams) -> Callable[[], Batch]:
        return self.rollout.dp_split_async(RolloutWorker.generate, prompts, sampling)

    def wait(self) -> None:
        """Before a sync: the generation in flight finishes (its calls run first anyway: this makes the wait a
        phase of its own, ``timing_s/gen_wait``, instead of part of the sync)."""
        if self.next is not None:
            self.next.batch()

    def synced(self) -> None:
        """After a sync: the rollout holds one more update; without overlap the next generation starts now."""
        self.version += 1
        if not self.overlap and self.sampling is not None:
            self.start_next()

    # ---------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The generation started ahead, finished (its samples go into the checkpoint: the resumed run trains on
        them as the uninterrupted one does, instead of regenerating from weights it no longer has)."""
        if self.next is None:
            return {"sampling": self.sampling}
        return {"sampling": self.sampling, "prompts": self.next.prompts, "next_sampling": self.next.sampling,
                "version": self.next.version, "batch": self.next.batch()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampling = state["sampling"]
        if "batch" in state:
            self.next = Pending(state["prompts"], state["next_sampling"], state["version"], state["batch"])

    def save(self, folder: Path) -> None:
        """Into a checkpoint's folder (``state_dict``)."""
        torch.save(self.state_dict(), folder / FILE)

    def restore(self, folder: Path, step: int) -> None:
        """From the checkpoint of ``step``: the samples generated ahead when it was saved (none: made at step 1)."""
        self.version = step
        if (folder / FILE).is_file():
            self.load_state_dict(torch.load(folder / FILE, weights_only=False))
