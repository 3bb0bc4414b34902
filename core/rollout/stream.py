"""A rollout rank's side of streaming generation (``trainer.async.mode: streaming``; the driver's side:
``core.streaming``): one engine run that lives across steps and weight updates. The driver adds prompt groups
(each with a key), advances it a few decode steps at a time and takes the groups that finished; a weight sync
between two calls raises ``version`` and recomputes the in-flight sequences' KV with the new weights
(``Run.reprefill``), so their next tokens come from the new policy alone -- a partial rollout. Every token records
the version that drew it (``rollout_versions``), and draws the uniform of its own (seed, index)
(``core.rollout.sampling.token_uniforms``): a sample is the same whichever calls, batches or updates it ran through.
"""

from __future__ import annotations

from typing import Any

import torch

from core.config import SamplingParams
from core.protocol import Batch
from core.rollout.batch import assemble, merge_padded
from core.rollout.run import Run


class StreamState:
    """The embedded engine's run across calls, and each prompt's group key (the driver's name for it)."""

    def __init__(self, engine, params: SamplingParams, max_prompt_length: int):
        self.engine, self.params = engine, params
        self.max_len = max_prompt_length + params.max_new_tokens
        self.widths = (max_prompt_length, params.max_new_tokens)
        self.run: Run = engine.stream(params, self.max_len)
        self.key: dict[int, Any] = {}        # prompt index -> group key
        self.left: dict[int, int] = {}       # prompt index -> its sequences not yet finished
        self.stale_kv = False                # the KV cache was freed or used by another call since the last step

    @property
    def version(self) -> int:
        return self.run.version

    def add(self, ids: list[list[int]], seeds: list[int], keys: list) -> None:
        """Queue prompt groups (one cohort: their shared prefix is prefilled once)."""
        for i, key in zip(self.run.add_prompts(ids, seeds, self.params.max_new_tokens), keys):
            self.key[i], self.left[i] = key, self.params.n

    def advance(self, steps: int) -> tuple[Batch | None, dict]:
        """Up to ``steps`` decode steps (fewer when nothing is queued or in flight). Returns the groups that
        finished, as one padded batch with a ``stream_key`` column and ``rollout_versions`` (B, Tr) -- or None --
        and the first version of each group that started in these steps (the driver's staleness bound)."""
        run, n = self.run, self.params.n
        if self.engine.cache is None or self.engine.cache.max_len < self.max_len:
            self.engine.wake(self.max_len)
            self.stale_kv = True
        if self.stale_kv:
            run.reprefill()
            self.stale_kv = False
        started, done = {}, []
        for _ in range(steps):
            if not (run.queue or run.live):
                break
            queued = set(run.queue)
            for seq in run.step():
                i = seq // n
                self.left[i] -= 1
                if self.left[i] == 0:
                    done.append(i)
            for i in queued - set(run.queue):  # admitted in this step: its first token is this version's
                started[self.key[i]] = run.version
        return self._finished(done), started

    def _finished(self, done: list[int]) -> Batch | None:
        if not done:
            return None
        prompts, tokens, logps, versions, seeds = zip(*(self.run.pop(i) for i in done))
        tokens, logps, versions = (sum(x, []) for x in (tokens, logps, versions))
        out = assemble(list(prompts), tokens, logps, self.params.n, self.engine.pad_id)
        out["rollout_versions"] = assemble(list(prompts), tokens, [list(map(float, v)) for v in versions],
                                           self.params.n, self.engine.pad_id)["rollout_logprobs"]
        out["rollout_seeds"] = torch.tensor(sum(seeds, []), dtype=torch.long)
        out = merge_padded([out], self.engine.pad_id, *self.widths)
        keys = [self.key.pop(i) for i in done]
        for i in done:
            del self.left[i]
        out["stream_key"] = [k for k in keys for _ in range(self.params.n)]
        return out

    def reweighted(self) -> None:
        """After a weight sync: the next tokens are the next version's; the in-flight sequences' KV is recomputed
        with the new weights before the next step."""
        self.run.version += 1
        self.stale_kv = True

    def state_dict(self) -> dict:
        """For a checkpoint: the sampling, the run's sequences (``Run.state_dict``) and the groups' keys."""
        return {"params": self.params, "widths": self.widths, "run": self.run.state_dict(), "key": self.key,
                "left": self.left}

    @staticmethod
    def from_state(engine, state: dict) -> "StreamState":
        """The stream ``state_dict`` saved, on ``engine`` with the weights it holds now: the in-flight sequences'
        KV is recomputed from their tokens before the next step, as after a weight sync."""
        out = StreamState(engine, state["params"], state["widths"][0])
        out.run.load_state_dict(state["run"])
        out.key, out.left, out.stale_kv = state["key"], state["left"], True
        return out

    def abort(self, keys: set) -> None:
        """Drop these groups, queued or in flight (over the staleness bound: they would never be trained on)."""
        gone = {i for i, k in self.key.items() if k in keys}
        self.run.abort(gone)
        for i in gone:
            self.run.pop(i)
            del self.key[i], self.left[i]


def versions_tensor(batch: Batch) -> torch.Tensor:
    """Each sample's first (oldest) token version (B,); its response mask picks the valid tokens."""
    v = batch["rollout_versions"].masked_fill(batch["response_mask"] == 0, float("inf"))
    return v.amin(-1)
