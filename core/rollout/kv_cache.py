"""A preallocated, slot-based KV cache that a transformers model writes through its own attention modules.

Layout per layer: keys ``(slots, kv_heads, max_len, k_dim)``, values ``(slots, kv_heads, max_len, v_dim)`` (the widths
differ for multi-head latent attention, whose cache holds DeepSeek-V3's compressed latents: ``for_model``). Each running sequence owns one slot.
A prefix shared by all prompts of a call (P tokens, 0 when none) sits at ``[0, P)``; the rest of the prompt sits
left-padded at ``[start, prefill_len)``; generated tokens follow at ``prefill_len, prefill_len + 1, ...``.
Live sequences always occupy slots ``[0, n)`` (a finished one is replaced by the last), so every forward reads
plain views ``keys[:n, :, :kv_len]``: no gather, no concatenation, no per-step allocation.

The engine tells the cache where this forward writes (``prefill_into`` / ``decode_at``) and builds the
4D attention mask itself (transformers passes a 4D mask through unchanged), so the model's own attention code
runs unmodified: ``past_key_values.update(k, v, layer_idx)`` lands here.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from core.kernels import cpu as cpu_kernels
from core.memory import heap_zeros


class SlotKVCache(Cache):
    def __init__(self, num_layers: int, slots: int, max_len: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, v_dim: int | None = None):
        super().__init__(layers=[])  # no transformers layer objects: update() below is the whole contract
        shape = (slots, kv_heads, max_len, head_dim)
        # on CPU from plain malloc: a cache freed by sleep() and made again by wake() lands on the same pages
        zeros = (lambda s: heap_zeros(s, dtype)) if torch.device(device).type == "cpu" else (
            lambda s: torch.zeros(s, dtype=dtype, device=device))
        self.keys = [zeros(shape) for _ in range(num_layers)]
        self.values = [zeros(shape[:-1] + (v_dim or head_dim,)) for _ in range(num_layers)]
        self.slots, self.max_len = slots, max_len
        self._rows: torch.Tensor | slice | None = None  # prefill: slot of each batch row (a slice: a range)
        self._offset = 0                          # prefill: first column it writes (after a shared prefix)
        self._pos: torch.Tensor | None = None    # decode: write position of each of slots [0, n)
        self._kv_len = 0

    @staticmethod
    def for_model(model, slots: int, max_len: int) -> "SlotKVCache":
        c = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        heads = c.num_attention_heads
        kv_heads = getattr(c, "num_key_value_heads", None) or heads
        k_dim = v_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        if getattr(c, "kv_lora_rank", None):
            # multi-head latent attention (DeepSeek-V3): transformers caches the compressed latents, one "head" of the
            # kv latent as the keys and of the rotary key as the values, and expands them after the cache
            kv_heads, k_dim, v_dim = 1, c.kv_lora_rank, c.qk_rope_head_dim
        p = next(p for p in model.parameters() if not p.is_meta)  # not a weight the engine keeps packed only
        return SlotKVCache(c.num_hidden_layers, slots, max_len, kv_heads, k_dim, p.dtype, p.device, v_dim)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def __len__(self) -> int:
        return len(self.keys)

    # ------------------------------------------------------------------ where the next forward writes
    def prefill_into(self, rows: torch.Tensor | slice, offset: int = 0) -> None:
        """The next forward is a prefill of ``len(rows)`` left-padded prompts, written to those slots at
        [offset, offset + q); with ``offset`` > 0 it attends to the prefix already at [0, offset) too."""
        self._rows, self._offset, self._pos = rows, offset, None

    def decode_at(self, positions: torch.Tensor, kv_len: int) -> None:
        """The next forward decodes one token for each of slots [0, n), written at ``positions`` (n,)."""
        self._rows, self._pos, self._kv_len = None, positions, kv_len

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.keys[layer_idx], self.values[layer_idx]
        if self._rows is not None:  # prefill
            o, q = self._offset, key_states.shape[2]
            k[self._rows, :, o:o + q] = key_states
            v[self._rows, :, o:o + q] = value_states
            if o == 0:  # attention needs only this forward's own keys
                return key_states, value_states
            return k[self._rows, :, :o + q], v[self._rows, :, :o + q]
        n = key_states.shape[0]
        if (k.device.type == "cpu" and not torch.is_grad_enabled() and cpu_kernels.available()
                and k.shape[-1] == v.shape[-1]):
            cpu_kernels.write_decode(k, v, key_states, value_states, self._pos)  # memcpy, not two index_puts
        else:
            idx = torch.arange(n, device=k.device)
            k[idx, :, self._pos] = key_states[:, :, 0]
            v[idx, :, self._pos] = value_states[:, :, 0]
        return k[:n, :, :self._kv_len], v[:n, :, :self._kv_len]

    # ------------------------------------------------------------------ slot moves
    def copy(self, src: int, dst: int | slice, length: int) -> None:
        """Slot ``src``'s first ``length`` positions into slot(s) ``dst``: a prompt's KV to its other n - 1
        samples (shared prefill), or the last live slot into a finished one (live slots stay contiguous)."""
        for t in self.keys + self.values:
            t[dst, :, :length] = t[src, :, :length]

    def read(self, slot: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A copy of slot ``slot``'s first ``length`` positions, per layer (a shared prefix, kept aside)."""
        return [(k[slot, :, :length].clone(), v[slot, :, :length].clone()) for k, v in zip(self.keys, self.values)]

    def write(self, rows: torch.Tensor | slice, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Put ``kv`` (from ``read``) at the start of every slot in ``rows``."""
        for (k, v), (pk, pv) in zip(zip(self.keys, self.values), kv):
            k[rows, :, :pk.shape[1]] = pk
            v[rows, :, :pv.shape[1]] = pv

    # transformers asks for these in some code paths; the engine always passes positions and a 4D mask
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._kv_len

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.max_len
