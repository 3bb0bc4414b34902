"""A rollout engine behind a server: one thread owns a run and decodes every request in flight together --
continuous batching across requests that arrive from any thread at any time, each sequence drawing from its own seed
(so its tokens do not depend on what else runs beside it). On the embedded engine the run is a session
(``RolloutEngine.session``): requests join between two decode steps. On vLLM's offline engine, which takes new
requests and weights only between ``generate`` calls, it is a ``ChunkedRun``: every call decodes up to ``CHUNK``
more tokens of each sequence in flight, and requests join at the next chunk.

A weight update pauses the loop between two decode steps (``paused``); the sequences in flight then recompute their
KV under the new weights and go on (a partial rollout: each token records the version that drew it), so a request
that arrives or runs during a sync waits and completes, never fails.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Sequence

from core.config.algo import SamplingParams
from core.rollout.stream import ChunkedRun

# tokens per vLLM call: each call re-queues its sequences (their prefixes cache hits), so fewer calls cost less;
# a request arriving meanwhile waits for the next call
CHUNK = 16


@dataclass(frozen=True)
class Completion:
    tokens: list[int]
    logps: list[float]
    versions: list[int]


class EngineLoop:
    """Requests (``submit``) decoded together by one thread; ``max_len``: the longest prompt + completion. A thread of
    its own decodes (``own_thread``), or the caller does (``drive``): a rollout worker's main thread decodes ~20%
    faster than another thread of its process, and its agents' requests are served meanwhile."""

    def __init__(self, engine, params: SamplingParams, max_len: int, own_thread: bool = True):
        self.engine, self.max_len = engine, max_len
        # a session: one cohort with no shared prefix, so that requests queued together are prefilled together
        session = getattr(engine, "session", None)
        self.run = session([], replace(params, n=1), max_len) if session else ChunkedRun(engine, replace(params, n=1))
        self.advance = self.run.step if session else (lambda: self.run.step(CHUNK))
        self.cond = threading.Condition()
        self.incoming: deque = deque()
        self.waiting: dict[int, Future] = {}
        self.pauses = 0
        self.prefixes: list[tuple[int, list[int]]] = []   # (cohort, its shared prefix), the first match taken
        self.stepping = self.closed = False
        self.version = 0
        self.thread = threading.Thread(target=self._loop, name="engine-loop", daemon=True) if own_thread else None
        if self.thread is not None:
            self.thread.start()

    def submit(self, ids: Sequence[int], max_new_tokens: int, seed: int, stop: Sequence[str] = ()) -> Future:
        """A Future of the ``Completion`` of ``ids``. Raises ValueError when it cannot fit."""
        if len(ids) + max_new_tokens > self.max_len:
            raise ValueError(f"{len(ids)} prompt tokens + max_tokens {max_new_tokens} exceed the server's "
                             f"{self.max_len}-token sequences")
        future: Future = Future()
        with self.cond:
            if self.closed:
                raise RuntimeError("the engine loop is closed")
            self.incoming.append((list(ids), max_new_tokens, seed, tuple(stop), future))
            self.cond.notify_all()
        return future

    def _cohort(self, ids: list[int]) -> int:
        """The run's cohort whose shared prefix ``ids`` extends (0: none, prefilled whole)."""
        for c, prefix in self.prefixes:
            if len(ids) > len(prefix) and ids[:len(prefix)] == prefix:
                return c
        return 0

    def _share_prefixes(self, new: list[list[int]]) -> None:
        """Requests that arrive together and share a prefix (agents of one prompt, a few-shot preamble) form a
        cohort: the prefix is prefilled once, and so are the later turns that extend it (a trajectory's next
        turn re-prefills only what follows it)."""
        fresh = [ids for ids in new if self._cohort(ids) == 0]
        if len(fresh) >= 2 and hasattr(self.run, "add_cohort"):
            c = self.run.add_cohort(fresh)
            if self.run.cohorts[c].P:
                self.prefixes.append((c, list(self.run.cohorts[c].prefix)))

    def drive(self, until: Future) -> None:
        """Decode in the calling thread until ``until`` is done (the agents this loop serves have finished)."""
        until.add_done_callback(lambda _: self._wake())
        self._loop(until.done)

    def _wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def _loop(self, finished=lambda: False) -> None:
        while True:
            with self.cond:
                while not self.closed and not finished() and (self.pauses or not (self.incoming or self.waiting)):
                    self.cond.wait()
                if self.closed or finished():
                    return
                seen = -1
                while not self.waiting and len(self.incoming) > seen:  # idle until now: let requests sent together
                    seen = len(self.incoming)                            # arrive together (one prefill), until
                    self.cond.wait(timeout=0.005)                        # 5 ms bring none
                self._share_prefixes([r[0] for r in self.incoming])
                while self.incoming:
                    ids, max_new, seed, stop, future = self.incoming.popleft()
                    i = self.run.add(ids, max_new, seed, cohort=self._cohort(ids), stop=stop)
                    self.waiting[i] = future
                self.stepping = True
            try:
                done = self.advance()
                results = [(self.waiting.pop(i), self.run.pop(i)) for i in done]
            except BaseException as e:  # the engine failed: every request in flight hears why
                with self.cond:
                    failed, self.waiting = list(self.waiting.values()), {}
                    self.stepping, self.closed = False, True
                    self.cond.notify_all()
                for future in failed:
                    future.set_exception(e)
                return
            with self.cond:
                self.stepping = False
                self.cond.notify_all()
            for future, (_, (tokens,), (logps,), (versions,), _) in results:
                future.set_result(Completion(tokens, logps, versions))

    @contextmanager
    def paused(self):
        """No decode step runs inside the block (update the weights there and set ``version``); after it, the
        sequences in flight recompute their KV under the weights of the new version and go on."""
        with self.cond:
            self.pauses += 1
            while self.stepping:
                self.cond.wait()
        before = self.run.version
        try:
            yield self
        finally:
            if self.version != before:
                self.run.version = self.version
                self.run.reprefill()
            with self.cond:
                self.pauses -= 1
                self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join(timeout=30)
        for future in self.waiting.values():
            future.cancel()
