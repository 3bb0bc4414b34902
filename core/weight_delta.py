"""Delta weight syncs: after a first full sync, each sync sends only the bits of the weights that changed.

The sender is every actor rank, for its own shard of each weight (no all-gather): it keeps a *shadow*, the shard as
the receiver holds it (cast to the receiver's dtype) at the last sync, and XORs the shard's new cast with it. Per
shard, the smallest of three encodings travels (``encode``; a shard of n values of s bytes, c of them changed):

- ``k = 0``, sparse: the changed positions and their new values, about ``c (1 + s)`` bytes. A bf16 receiver: an
  update moves ~1-10% of bf16 values at RL learning rates (the other updates round back to the same bf16 value).
- ``0 < k < s``, low bytes of the XOR: its k low-order bytes for every value, plus the values whose XOR reaches
  above them as exceptions (position and value): ``n k + e (1 + s)``. An fp32 receiver: ~99% of fp32 values change
  every step, but by a few hundred ulps, so their XOR fits in 2 or 3 of the 4 bytes (sign and exponent stay).
- ``k = -1``, values: the shard's new values, ``n s``, when no delta is smaller, and on a full sync.

Positions travel as the gaps between them in 8 or 16 bits (a gap too long gets fillers: positions every 255 or
65535 that carry their unchanged value), or as int32, whichever is smallest (``positions``).

Worked example, an fp32 shard of 8 values whose new values differ from the shadow by the XORs 0, 0x1f3, 0x24,
0x3c000000, 0, 0x51, 0, 0x1a0: sparse = 5 changed x (1 gap byte + 4) = 25 bytes; k = 1 leaves 3 exceptions
(0x1f3, 0x3c000000, 0x1a0): 8 + 15 = 23; k = 2 leaves 1: 16 + 5 = 21; k = 3: 24 + 5 = 29; values 32. k = 2 travels
(21 bytes; values win ties).

Each bucket travels with a CRC-32 of its parts (``Bucket.crc``); the receiver checks it before writing anything
(a flipped byte in transit is caught and the sync restarts in full, ``core.roles.sync_across_pools``). Deltas apply
only to the weights they were computed against: a bucket names the sync it builds on (``base``) and the receiver
refuses one whose base is not what it holds. A hash of the receiver's weights against the trainer's every
``rollout.sync_hash_every`` delta syncs and at every checkpoint catches any other drift.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import torch

INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # a dtype's bits, for XOR


@dataclass
class Part:
    """One rank's shard of one weight, encoded: the values at flat positions ``offset .. offset + numel`` of the
    full tensor ``name`` of ``shape``."""
    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int
    k: int                  # -1: values; 0..s-1: the XOR's k low bytes of every value (k*numel uint8) + exceptions
    planes: torch.Tensor    # uint8, numel * k
    index: torch.Tensor     # exceptions' positions in the shard (int32, or int64 for a shard of 2**31 values)
    values: torch.Tensor    # the exceptions' new values, or every value (k = -1)
    gaps: int = 0           # index: absolute positions (0), or gaps between them in 8 or 16 bits (``positions``)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.planes, self.index, self.values))


@dataclass
class Bucket:
    """One rank's parts of one bucket of weights, with the sync they build on and a CRC-32 of their bytes."""
    parts: list[Part]
    base: str | None        # the sync whose weights the deltas are against (None: every part is values)
    changed: int = 0        # values that differ from the shadow (every value on a full sync)
    total: int = 0          # values in the parts
    crc: int = field(default=0)

    def seal(self) -> "Bucket":
        self.crc = checksum(self.parts)
        return self

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


def checksum(parts: list[Part]) -> int:
    """CRC-32 over every part's header and bytes (catches any flipped byte or bit in transit)."""
    crc = 0
    for p in parts:
        crc = zlib.crc32(f"{p.name}\0{p.shape}\0{p.offset}\0{p.numel}\0{p.k}\0{p.gaps}\0".encode(), crc)
        for t in (p.planes, p.index, p.values):
            crc = zlib.crc32(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy(), crc)
    return crc


def encode(name: str, shape: tuple[int, ...], offset: int, new: torch.Tensor, old: torch.Tensor | None,
           delta: bool = True) -> tuple[Part, int]:
    """The smallest encoding of a shard's new values ``new`` (flat, the receiver's dtype) against ``old`` (the
    shadow, or None); ``delta`` false: its values (the receiver may not hold ``old``). Returns the part, on CPU,
    and how many values differ from ``old`` (all of them without one)."""
    n, s = new.numel(), new.element_size()
    if old is None:
        return _values(name, shape, offset, new), n
    bits = INT[s]
    x = new.view(bits) ^ old.view(bits)
    changed = int(torch.count_nonzero(x))
    if not delta:
        return _values(name, shape, offset, new), changed
    # each k's size at one position byte per exception (counted only while n k can still win), then the exact
    # encoding of the smallest
    best, k = changed * (1 + s), 0
    for kk in range(1, s):
        if n * kk >= best:
            break
        size = n * kk + int(torch.count_nonzero(x >> (8 * kk))) * (1 + s)
        if size < best:
            best, k = size, kk
    if best >= n * s:
        return _values(name, shape, offset, new), changed
    codes, gaps, index = positions(((x >> (8 * k)) if k else x).nonzero().reshape(-1), s)
    if codes.numel() * codes.element_size() + index.numel() * s + n * k >= n * s:
        return _values(name, shape, offset, new), changed
    planes = x.view(torch.uint8).view(n, s)[:, :k].reshape(-1) if k else torch.empty(0, dtype=torch.uint8)
    return Part(name, tuple(shape), offset, n, k, planes.cpu().contiguous(), codes.cpu(), new[index].cpu(),
                gaps), changed


def positions(index: torch.Tensor, s: int) -> tuple[torch.Tensor, int, torch.Tensor]:
    """Sorted positions (int64) as the fewest bytes, with values of ``s`` bytes beside them: absolute (int32) or
    the gaps from the previous position (the first from -1) in 8 or 16 bits, where a gap too long for them gets
    fillers -- positions every 2**bits - 1 that carry their unchanged value. Returns (codes, gap bits or 0, the
    positions the values go with, fillers included)."""
    absolute = index.to(torch.int32 if index.numel() == 0 or int(index[-1]) < 2**31 else torch.int64)
    if index.numel() == 0:
        return absolute, 0, index
    gap = torch.diff(index, prepend=index.new_full((1,), -1))
    best = (absolute.numel() * (absolute.element_size() + s), 0)
    for width in (8, 16):
        size = (index.numel() + int(((gap - 1) // (2**width - 1)).sum())) * (width // 8 + s)
        best = min(best, (size, width))
    width = best[1]
    if not width:
        return absolute, 0, index
    top = 2**width - 1
    fill = (gap - 1) // top  # fillers before each position
    if int(fill.sum()):
        starts = (index - gap).repeat_interleave(fill)
        within = torch.arange(int(fill.sum())) - (torch.cumsum(fill, 0) - fill).repeat_interleave(fill)
        index = torch.sort(torch.cat([index, starts + top * (within + 1)])).values
        gap = torch.diff(index, prepend=index.new_full((1,), -1))
    return gap.to(torch.uint8 if width == 8 else torch.int16), width, index


def _decode_positions(codes: torch.Tensor, gaps: int) -> torch.Tensor:
    if not gaps:
        return codes.to(torch.int64)
    return torch.cumsum(codes.to(torch.int64) & (2**gaps - 1), 0) - 1


def _values(name, shape, offset, new: torch.Tensor) -> Part:
    empty = torch.empty(0, dtype=torch.uint8)
    return Part(name, tuple(shape), offset, new.numel(), -1, empty, empty.to(torch.int32),
                new.detach().to("cpu").clone())


def apply(part: Part, flat: torch.Tensor) -> None:
    """Write ``part`` into ``flat``, the full tensor's values (the receiver's dtype), in place."""
    dst = flat[part.offset:part.offset + part.numel]
    vals = part.values.to(dst.device)
    if part.k < 0:
        dst.copy_(vals)
        return
    bits = INT[dst.element_size()]
    d = dst.view(bits)
    if part.k:
        low = torch.zeros(part.numel, dst.element_size(), dtype=torch.uint8, device=dst.device)
        low[:, :part.k] = part.planes.to(dst.device).view(part.numel, part.k)
        d ^= low.view(bits).view(-1)
    d[_decode_positions(part.index, part.gaps).to(dst.device)] = vals.view(bits)
