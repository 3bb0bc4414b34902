"""CPU linears on weights packed once, with sibling linears that read the same input fused.

Why: a decode step is ~120 small matmuls (64 rows x 576 x 192..1536 for SmolLM2). ``F.linear`` re-lays out the
weight on every call; a weight packed once skips that, and one matmul against the concatenated q/k/v (or
gate/up) weights replaces three (or two) calls. The packed formats:
- bf16, ours (``kernel``), ``csrc/linear.cpp``: AVX512-BF16 dot products on a [K/2][48 columns][2] layout, each
  thread's next tile prefetched while one is in use. On 2 cores, 64 rows, the 121 matmuls of a SmolLM2 decode
  step with their weights streamed from DRAM: 19 ms, against 26 ms on oneDNN's packed format. fp32 sums rounded
  once to bf16 as oneDNN does, up to the order of the additions: within a bf16 rounding of the fp32 product
  (tests/rollout/test_packed.py).
  Without AVX512-BF16 the same sums in the instruction's order on 16-lane vectors: on AVX-512 1.4-1.6x faster than
  oneDNN's bf16 (2-core Xeon without bf16 hardware, 64 rows x 576..3072 columns), so chosen there too; on AVX2
  slower, so used only for ``rollout.exact_logprobs`` (batch-invariant: each output one sum in one order).
- bf16, oneDNN's (``mkldnn._reorder_linear_weight`` + ``_linear_pointwise``) where ours is not built or not chosen
  (AVX2; oneDNN runs bf16 natively on AMX): bit-identical to ``F.linear`` (tests).
- fp32 (the engine's dtype on CPUs without bf16 hardware), ours, ``csrc/fp32.cpp``: AVX2 + FMA on a [K][16
  columns] layout, 6 x 16 register blocks, the next tile prefetched the same way; fp32 sums in another order than
  MKL's, so within a few fp32 ulps of ``F.linear`` (tests), not bit-identical.

The model's own modules still run: each packed ``nn.Linear`` gets an instance ``forward`` that calls the packed
kernel. Which linears are siblings is found, not hard-coded: one calibration forward records which linears are
called on the very same input tensor (a Llama layer's q/k/v and gate/up; any model's equivalents). A group's
first call computes the fused product and hands the others their column slices; a call on any other input (or
the same tensor modified in place) computes again, so a wrong grouping costs time, never correctness.

The packed copy is the engine's compute format. By default the model's parameters stay (a weight sync writes both)
and ``refresh`` re-packs what a weight update touched: in our format each new weight straight into its rows of the
packed copy (one pass, no allocation). ``release_weights`` makes the packed copy the only one, for an engine that
owns its model: each linear's parameter is swapped for a meta tensor of its shape (freeing about half of the
engine's weight memory), a sync casts and packs the sent rows in one pass with nothing else written (as fast as a
plain cast copy, ``bench/test_sync.py``), and ``weight`` unpacks a released weight where its values are wanted.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Iterable

import torch


def can_pack(model: torch.nn.Module) -> bool:
    """CPU weights that a packed kernel runs here: bf16 where ours or oneDNN's runs it (``kernel_usable``), fp32 where
    our fp32 kernel is built (AVX2 + FMA)."""
    p = next(model.parameters())
    if p.device.type != "cpu":
        return False
    if p.dtype == torch.float32:
        return kernel_usable(torch.float32)
    return p.dtype == torch.bfloat16 and (kernel_usable() or _onednn_usable())


def kernel_usable(dtype: torch.dtype = torch.bfloat16, exact: bool = False) -> bool:
    """Our packed linear for ``dtype`` runs here: fp32 needs AVX2 + FMA (``csrc/fp32.cpp``); bf16
    (``csrc/linear.cpp``) runs wherever the kernels build, and is chosen where it is the faster one -- AVX512-BF16,
    and AVX-512 without it (the same sums emulated: 1.4-1.6x oneDNN's bf16 at a SmolLM2 decode step's shapes) --
    or, with ``exact``, everywhere (AVX2: the emulated sums, slower than oneDNN, but batch-invariant)."""
    from core.kernels import cpu as cpu_kernels

    if not cpu_kernels.available():
        return False
    if dtype == torch.float32:
        return torch.ops.hybridrl_cpu.linear_f32_native()
    return exact or cpu_kernels.isa() in ("avx512_bf16", "avx512")


def _onednn_usable() -> bool:
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class _Group:
    """Linears that read one input: one packed weight (their rows concatenated), one matmul per input."""

    def __init__(self, modules: list[torch.nn.Linear], rows_hint: int, kernel: bool):
        self.modules, self.rows_hint = modules, rows_hint
        fp32 = modules[0].weight.dtype == torch.float32
        self.kernel = kernel and (fp32 or modules[0].in_features % 2 == 0)  # bf16: ours packs k in pairs
        self.splits = [m.out_features for m in modules]
        self.out_features = sum(self.splits)
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self._input: torch.Tensor | None = None
        self._version = -1
        self._outs: tuple[torch.Tensor, ...] = ()
        self._taken = 0
        self.released: set[int] = set()  # modules whose packed rows are their weight's only copy
        self.pack()

    @torch.no_grad()
    def pack(self) -> None:
        if self.released:
            raise RuntimeError("re-packing a group from its modules' weights, but they were released to the packed copy")
        w = torch.cat([m.weight for m in self.modules]) if len(self.modules) > 1 else self.modules[0].weight
        if self.kernel:
            self.weight = torch.ops.hybridrl_cpu.pack_linear(w.detach())
        else:
            self.weight = torch.ops.mkldnn._reorder_linear_weight(w.detach(), self.rows_hint)
        self.pack_bias()

    @torch.no_grad()
    def pack_bias(self) -> None:
        self.bias = None
        real = [m.bias for m in self.modules if m.bias is not None]
        if real:  # zeros for a sibling without a bias, made like a real bias (its weight may be released: meta)
            self.bias = torch.cat([m.bias if m.bias is not None else real[0].new_zeros(m.out_features)
                                   for m in self.modules]).detach()
            if self.kernel:  # ours adds the bias in fp32: converted here once, not on every call
                self.bias = self.bias.float().contiguous()
        self._input, self._outs = None, ()

    @torch.no_grad()
    def pack_rows(self, index: int, new: torch.Tensor | None = None) -> None:
        """Our format only: module ``index``'s weight into its rows of the packed weight, in place (no allocation,
        no concatenation). With ``new``: the weight's new value (any dtype) cast and packed in one pass -- a weight
        sync's whole work for this linear -- and, unless the weight was released, written into its parameter too."""
        row0, weight = sum(self.splits[:index]), self.modules[index].weight.detach()
        if new is not None:
            kept = None if index in self.released else weight
            torch.ops.hybridrl_cpu.load_linear_rows(self.weight, kept, new.detach(), row0, self.out_features)
        elif index in self.released:
            raise RuntimeError(f"linear {index} of a packed group: its weight was released, re-pack it from new values")
        else:
            torch.ops.hybridrl_cpu.pack_linear_into(self.weight, weight, row0, self.out_features)
        self._input, self._outs = None, ()

    def unpack(self, index: int) -> torch.Tensor:
        """Module ``index``'s weight from the packed rows (our format), bit for bit."""
        m = self.modules[index]
        return torch.ops.hybridrl_cpu.unpack_linear(self.weight, sum(self.splits[:index]), m.out_features,
                                                    self.out_features, m.in_features)

    def weight_index(self, param: torch.Tensor) -> int | None:
        """Which module's weight ``param`` is (None: not one of this group's weights, e.g. a bias)."""
        return next((i for i, m in enumerate(self.modules) if m.weight is param), None)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel:
            return torch.ops.hybridrl_cpu.linear_packed(x, self.weight, self.bias, self.out_features)
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")

    def forward_of(self, index: int) -> Callable[[torch.Tensor], torch.Tensor]:
        if len(self.modules) == 1:
            return self._matmul

        def forward(x: torch.Tensor) -> torch.Tensor:
            if x is not self._input or x._version != self._version or not self._outs:
                self._outs = self._matmul(x).split(self.splits, dim=-1)
                self._input, self._version, self._taken = x, x._version, 0
            out = self._outs[index]
            self._taken += 1
            if self._taken == len(self.modules):  # every sibling has its slice: hold nothing past this layer
                self._input, self._outs = None, ()
            return out

        return forward

    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()


class PackedLinears:
    """Every ``nn.Linear`` of ``model`` switched to packed (and, for siblings, fused) weights."""

    def __init__(self, model: torch.nn.Module, calibrate: Callable[[], object], rows_hint: int,
                 kernel: bool = True, exact: bool = False):
        """``calibrate`` runs one small forward of ``model`` (any input); ``rows_hint`` is the usual number of
        rows per matmul (the engine's batch), which oneDNN uses to choose its blocking; ``kernel``: our packed
        format where usable (True), or oneDNN's (False); ``exact``: ours wherever it builds (``kernel_usable``)."""
        self.model = model
        kernel = kernel and kernel_usable(next(model.parameters()).dtype, exact)
        self.groups = [_Group(g, rows_hint, kernel) for g in _siblings(model, calibrate)]
        self._by_param: dict[int, list[_Group]] = {}
        for g in self.groups:
            for i, m in enumerate(g.modules):
                m.forward = g.forward_of(i)
                for p in (m.weight, m.bias):
                    if p is not None:
                        self._by_param.setdefault(id(p), []).append(g)

    def load(self, param: torch.Tensor, new: torch.Tensor) -> bool:
        """Write ``new`` into ``param`` and its packed rows in one pass when ``param`` is the weight of exactly one
        linear in our format (True); otherwise do nothing (False: copy it and ``refresh``)."""
        groups = self._by_param.get(id(param), [])
        index = groups[0].weight_index(param) if len(groups) == 1 and groups[0].kernel else None
        if index is None:
            return False
        groups[0].pack_rows(index, new)
        return True

    def refresh(self, params: Iterable[torch.Tensor]) -> int:
        """Re-pack what a weight update touched: in our format a weight's own rows, in place; a bias, or a weight
        in oneDNN's format, its whole group. Returns the number of (group, parameter) re-packs."""
        stale, packs = {}, 0
        for p in params:
            for g in self._by_param.get(id(p), []):
                index = g.weight_index(p)
                if g.kernel and index is not None:
                    g.pack_rows(index)
                    packs += 1
                else:
                    stale[id(g)] = g
        for g in stale.values():
            g.pack() if not g.kernel else g.pack_bias()
        return packs + len(stale)

    @torch.no_grad()
    def release_weights(self) -> int:
        """Make the packed rows the only copy of every weight in our format that its own linear alone reads (not one
        tied to another module, as an embedding to its LM head). Each such parameter is replaced by one on the meta
        device, same shape and dtype: a sync still finds it by name and ``load`` packs into it, while anything that
        reads its values fails loudly instead of reading stale ones (``weight`` unpacks it). Take the model's
        parameters again after this call. Returns the bytes freed."""
        users = Counter(id(p) for m in self.model.modules() for p in m._parameters.values() if p is not None)
        freed = 0
        for g in self.groups:
            for i, m in enumerate(g.modules):
                w = m.weight
                if not g.kernel or i in g.released or users[id(w)] != 1 or len(self._by_param[id(w)]) != 1:
                    continue
                m.weight = torch.nn.Parameter(torch.empty_like(w, device="meta"), requires_grad=w.requires_grad)
                self._by_param[id(m.weight)] = self._by_param.pop(id(w))
                g.released.add(i)
                freed += w.numel() * w.element_size()
        return freed

    def weight(self, param: torch.Tensor) -> torch.Tensor:
        """The values of ``param``: itself, or unpacked from its packed rows when it was released."""
        groups = self._by_param.get(id(param), [])
        index = groups[0].weight_index(param) if len(groups) == 1 else None
        return groups[0].unpack(index) if index is not None and index in groups[0].released else param

    def remove(self) -> None:
        """Back to the plain ``nn.Linear`` forward (released weights unpacked into new parameters: take the model's
        parameters again after this call)."""
        for g in self.groups:
            for i, m in enumerate(g.modules):
                if i in g.released:
                    m.weight = torch.nn.Parameter(g.unpack(i), requires_grad=m.weight.requires_grad)
                del m.forward
        self.groups, self._by_param = [], {}

    @property
    def nbytes(self) -> int:
        return sum(g.nbytes() for g in self.groups)


def _siblings(model: torch.nn.Module, calibrate: Callable[[], object]) -> list[list[torch.nn.Linear]]:
    """The model's linears grouped by the input tensor they were called on in one forward (call order kept)."""
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    seen: dict[int, list[torch.nn.Linear]] = {}
    alive: list[torch.Tensor] = []  # keep each input alive so that no id is reused during the forward

    def hook(module, args):
        x = args[0]
        alive.append(x)
        group = seen.setdefault(id(x), [])
        if module not in group:
            group.append(module)

    handles = [m.register_forward_pre_hook(hook) for m in linears]
    try:
        with torch.no_grad():
            calibrate()
    finally:
        for h in handles:
            h.remove()
    fused: list[list[torch.nn.Linear]] = []
    for g in seen.values():
        if len(g) > 1 and not _shared(g, seen) and len({(m.in_features, m.weight.dtype) for m in g}) == 1:
            fused.append(g)
    in_fused = {id(m) for g in fused for m in g}
    # a linear called on several inputs, alone on its input, or never called is packed on its own
    return fused + [[m] for m in linears if id(m) not in in_fused]


def _shared(group: list[torch.nn.Linear], seen: dict[int, list[torch.nn.Linear]]) -> bool:
    """A member also called on another input (e.g. one module reused): fusing it would be wrong for one input."""
    return any(m in other for m in group for other in seen.values() if other is not group)
