"""Decode steps at fixed shapes, replayed as CUDA graphs on a GPU (one graph per batch-size bucket).

On an H100 the embedded engine decoded a 135M model no faster than ``generate`` (1.00x, 0.2% of the roofline):
each step launches ~10 small kernels per layer and the GPU waits on Python between them. A CUDA graph records a
step's kernels once and replays them with one launch, but it replays exactly what it recorded: the same shapes
and the same memory. So a step here has fixed shapes --

- ``b`` rows: the live slots ``[0, L)`` padded to the smallest bucket ``b >= L`` (powers of two up to the
  engine's slots). A pad row decodes the pad token into a free slot (live slots are always ``[0, L)``, so slots
  ``[L, b)`` hold no sequence); what it writes there is overwritten before any sequence reads it (a slot's
  columns are written by its prefill or decode step before its mask lets it read them);
- the whole cache's length ``T`` as the key length: columns past a slot's position are masked out (their
  softmax weight is exp(-inf) = 0 exactly), so the result is the dynamic step's up to summation order;

-- and its inputs (tokens, write positions, rotary positions, additive mask) are copied into buffers that live
as long as the cache. Weights are updated in place (``RolloutEngine.update_weights``), so a graph stays valid
across weight syncs; a new cache (``wake`` with a longer ``max_len``, or after ``sleep``) drops the graphs.
Sampling stays outside the graph (it draws from a CPU generator, for runs reproducible on any device).

Elsewhere (CPU) the same fixed-shape step runs eagerly: that is how the tests check it against the dynamic step
(the engine uses the dynamic step on CPU, where a shorter key length is simply less work). Not yet run on a GPU:
``tests/rollout/test_decode_graphs.py`` has the GPU checks (marked ``gpu``), ``bench/test_rollout.py`` the speed.
"""

from __future__ import annotations

import torch


def buckets(slots: int) -> list[int]:
    """Batch sizes with a graph of their own: powers of two below ``slots``, and ``slots``."""
    out, b = [], 1
    while b < slots:
        out.append(b)
        b *= 2
    return out + [slots]


class DecodeGraphs:
    """Fixed-shape decode steps over one ``SlotKVCache`` (``engine.cache``); ``decode`` runs one."""

    def __init__(self, engine, capture: bool | None = None):
        """``capture``: record CUDA graphs (None: where the engine's device is a GPU); False runs the
        fixed-shape step eagerly."""
        self.e = engine
        self.capture = engine.device.type == "cuda" if capture is None else capture
        self.buckets = buckets(engine.max_batch_size)
        self._cache = None                      # the cache the buffers and graphs below were made for
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = None

    def drop(self) -> None:
        """Forget the graphs and buffers (the cache they were made for is being freed)."""
        self._graphs.clear()
        self._cache = self._pool = None

    def _buffers_for(self, cache) -> None:
        if cache is self._cache:
            return
        S, T, dev = self.e.max_batch_size, cache.max_len, self.e.device
        self.drop()
        self._cache = cache
        self.ids = torch.full((S, 1), self.e.pad_id, dtype=torch.long, device=dev)
        self.write_pos = torch.full((S,), T - 1, dtype=torch.long, device=dev)
        self.rope_pos = torch.zeros(S, 1, dtype=torch.long, device=dev)
        self.mask = torch.zeros(S, 1, 1, T, dtype=self.e.dtype, device=dev)

    def decode(self, ids: torch.Tensor, write_pos: torch.Tensor, rope_pos: torch.Tensor, mask: torch.Tensor
               ) -> torch.Tensor:
        """Last-position logits (L, V) for the live slots [0, L): ``ids`` (L, 1) their last tokens,
        ``write_pos`` (L,) where each writes its KV, ``rope_pos`` (L, 1) its rotary position, ``mask``
        (L, 1, 1, T) additive over the whole cache."""
        cache = self.e.cache
        self._buffers_for(cache)
        L = len(ids)
        b = next(k for k in self.buckets if k >= L)
        self.ids[:L], self.write_pos[:L], self.rope_pos[:L], self.mask[:L] = ids, write_pos, rope_pos, mask
        if b > L:  # pad rows: the pad token, at the last column of a free slot, attending to every column
            self.ids[L:b], self.write_pos[L:b], self.rope_pos[L:b], self.mask[L:b] = self.e.pad_id, cache.max_len - 1, 0, 0
        if not self.capture:
            return self._step(b)[:L]
        if b not in self._graphs:
            self._graphs[b] = self._record(b)
        graph, logits = self._graphs[b]
        graph.replay()
        return logits[:L]

    def _step(self, b: int) -> torch.Tensor:
        self.e.cache.decode_at(self.write_pos[:b], self.e.cache.max_len)
        return self.e.last_logits(self.ids[:b], self.rope_pos[:b], self.mask[:b])

    def _record(self, b: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Warm the step up on a side stream (lazy initialisations must not land in the graph), then record it.
        The graphs share one memory pool: they never replay concurrently, and each one's output is read before
        the next replays."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step(b)
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self._step(b)
        return graph, logits
