"""Peak memory of a code region: device memory on CUDA, resident set size (RSS) on CPU.

CPU has no allocator statistics for torch tensors, so a thread samples ``/proc/self/statm`` every 2 ms; the peak
is reported above the RSS at entry. glibc keeps freed heap pages, so a region can reuse what an earlier one freed
and show (nearly) nothing: ``trim=True`` (benches) calls ``malloc_trim(0)`` at entry and exit to hand them back
first -- not in the training loop, where it would cost page faults every step. A region that allocates and frees
shows its high-water mark, and memory it leaves behind shows as well -- which is what a weight sync must not do.
"""

from __future__ import annotations

import ctypes
import os
import threading
from contextlib import contextmanager

import torch

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _trim() -> None:
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to hand back
        pass


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


class PeakMemory:
    """``peak_bytes``: the most memory above the level at entry; ``end_bytes``: what remained at exit."""

    peak_bytes = 0
    end_bytes = 0


@contextmanager
def peak_memory(device: torch.device | str = "cpu", interval_s: float = 0.002, trim: bool = False):
    """``with peak_memory(dev) as m: ...`` then read ``m.peak_bytes`` and ``m.end_bytes``."""
    m, device = PeakMemory(), torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield m
        torch.cuda.synchronize(device)
        m.peak_bytes = torch.cuda.max_memory_allocated(device) - start
        m.end_bytes = torch.cuda.memory_allocated(device) - start
        return
    if trim:
        _trim()
    start, stop, high = rss_bytes(), threading.Event(), [0]

    def sample():
        while not stop.wait(interval_s):
            high[0] = max(high[0], rss_bytes())

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield m
    finally:
        stop.set()
        t.join()
        if trim:
            _trim()  # what the region freed and glibc still holds is not retained
        end = rss_bytes()
        m.peak_bytes, m.end_bytes = max(high[0], end) - start, end - start
