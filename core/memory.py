"""Peak memory of a code region: device memory on CUDA, resident set size (RSS) on CPU.

CPU has no allocator statistics for torch tensors, so a thread samples ``/proc/self/statm`` every 2 ms; the peak
is reported above the RSS at entry. glibc keeps freed heap pages, so a region can reuse what an earlier one freed
and show (nearly) nothing: ``trim=True`` (benches) calls ``malloc_trim(0)`` at entry and exit to hand them back
first -- not in the training loop, where it would cost page faults every step. A region that allocates and frees
shows its high-water mark, and memory it leaves behind shows as well -- which is what a weight sync must not do.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import threading
import weakref
from contextlib import contextmanager

import torch

_PAGE = os.sysconf("SC_PAGE_SIZE")


def release_freed_memory() -> None:
    """Hand every free page glibc holds back to the OS (``malloc_trim(0)``), which ``keep_freed_memory`` otherwise
    keeps for this process's reuse: on request (``peak_memory(trim=True)`` in benches; nothing in the training loop,
    where it would bring the page faults back)."""
    try:
        _libc().malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to hand back
        pass


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4   # glibc's mallopt parameters (malloc.h)


def keep_freed_memory(trim_threshold_bytes: int = 1 << 30) -> bool:
    """Serve every allocation of this process from glibc's heap, never from a fresh ``mmap``, and hand memory back
    to the OS only past ``trim_threshold_bytes`` free at the heap's top. glibc maps each block over 32 MB on its own
    and unmaps it when freed, so every training step touched its big temporaries (the tied embedding's gradients,
    57 MB each in bf16; logits blocks) as new pages: ~270,000 page faults (~1 GB) per step of the short GRPO bench
    on a 2-core EPYC, ~0.8 s of an 8.9 s step; with this, a few hundred (tens of thousands in some steps once the
    flat shared-prompt rows made micro-batch sizes vary). The cost: freed blocks stay with this
    process for its reuse, as with jemalloc or tcmalloc, and glibc's aligned allocations leave some holes before the
    heap settles (tests/test_memory.py: a loop of one 64 MB tensor settled at ~0.8 GB resident). CPU workers call it
    (``core.worker.WorkerHost``); ``release_freed_memory`` hands free pages back; ``HYBRIDRL_CPU_MALLOC=0`` leaves
    glibc's defaults. False where it did nothing."""
    if os.environ.get("HYBRIDRL_CPU_MALLOC", "1") == "0":
        return False
    try:
        libc = _libc()
        return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, trim_threshold_bytes))
    except (OSError, AttributeError):  # not glibc
        return False


def heap_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor on memory from plain ``malloc`` (64-byte aligned inside it), freed with the tensor.
    torch's CPU allocator asks glibc for aligned memory (``posix_memalign``), which carves the aligned part out of the
    block it finds and keeps the leftover sliver in a cache of its own, beside the block; freed, the block leaves a
    hole that the next aligned request of the same size does not fit, so that request takes fresh pages: a KV cache
    of 4 blocks, freed by ``sleep`` and allocated again by ``wake``, took fresh pages for half of itself or more in
    about 1 of 4 wakes (tests/test_memory.py). ``malloc`` of the same size takes the hole whole. Not glibc (or an
    empty tensor): ``torch.zeros``."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    try:
        libc = _libc()
    except (OSError, AttributeError):
        libc = None
    if libc is None or nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    ptr = libc.malloc(nbytes + 64)
    if not ptr:
        raise MemoryError(f"malloc of {nbytes / 2**20:.0f} MB failed")
    block = (ctypes.c_char * nbytes).from_address((ptr + 63) & ~63)
    weakref.finalize(block, libc.free, ptr)  # the tensor holds the block: freed with its last view
    return torch.frombuffer(block, dtype=torch.uint8).view(dtype).view(shape).zero_()


@functools.cache
def _libc() -> ctypes.CDLL:
    """This process's C library (glibc's malloc, free, mallopt, malloc_trim), its pointer types declared once."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
    return libc


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
        release_freed_memory()
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
            release_freed_memory()  # what the region freed and glibc still holds is not retained
        end = rss_bytes()
        m.peak_bytes, m.end_bytes = max(high[0], end) - start, end - start
