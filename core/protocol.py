"""The one batch type that flows through the whole RL dataflow.

A ``Batch`` holds three things, all indexed by sample along dim 0:

* ``tensors``      -- ``dict[str, torch.Tensor]``, every tensor has ``shape[0] == len(batch)``;
* ``non_tensors``  -- ``dict[str, np.ndarray]`` of ``dtype=object`` (strings, dicts, ragged lists), length ``len(batch)``;
* ``meta``         -- a plain dict for batch-wide facts (temperature, global token counts, ...).

Key vocabulary (B = samples, Tp = prompt tokens, Tr = response tokens, T = Tp + Tr).
Prompts are left-padded, responses right-padded, so ``input_ids = cat(prompts, responses)``.

==================  ===========  ======  =============================================================
key                 shape        dtype   meaning
==================  ===========  ======  =============================================================
input_ids           (B, T)       long    prompt + response token ids
attention_mask      (B, T)       long    1 on real tokens, 0 on padding
position_ids        (B, T)       long    positions that skip left padding
prompts             (B, Tp)      long    the prompt part of ``input_ids``
responses           (B, Tr)      long    the response part of ``input_ids``
response_mask       (B, Tr)      float   1 on response tokens that count (after EOS: 0; in an agent's multi-turn
                                         response also 0 on the tool-output and template tokens between turns,
                                         which ``attention_mask`` keeps at 1)
rollout_logprobs    (B, Tr)      float   log-probs of the sampled tokens as the rollout engine saw them
old_logprobs        (B, Tr)      float   the same tokens' log-probs under the actor before the update
old_from_update     (B,)         bool    rows whose ``old_logprobs`` the actor's update fills in from its own
                                         first forward (0 until then; ``FSDPActor.compute_logprobs``)
ref_logprobs        (B, Tr)      float   ... under the frozen reference policy
teacher_logprobs    (B, Tr)      float   ... under on-policy distillation's frozen teacher (teacher.model)
entropy             (B, Tr)      float   per-token entropy of the actor's distribution
values              (B, Tr)      float   critic values per response token
scores              (B,)         float   outcome reward of each sample (the reward function's output; with a reward
                                         model, its weighted sum with ``rm_scores``: ``core.loop.score``)
rm_scores           (B,)         float   the reward model's score of each sample (``RewardModelWorker``)
function_scores     (B,)         float   with a reward model: the reward function's own score of each sample
prm_logprobs        (B, Tr)      float   the implicit PRM's log-probs of the response tokens (``core.implicit_prm``)
process_rewards     (B, Tr)      float   its dense rewards: beta (prm_logprobs - ref_logprobs), normalised
num_turns           (B,)         float   agent rollouts: model turns of each trajectory (``core.rollout.agent_loop``)
num_tool_calls      (B,)         float   ... tool calls it made
num_tool_errors     (B,)         float   ... calls that failed (unparsable, unknown tool, error, timeout, flood)
truncated           (B,)         float   ... 1 when its last turn did not end at EOS (a length limit, max_turns)
rollout_seeds       (B,)         long    each sample's seed: its token t was drawn with ``token_uniforms(seed, t)``
                                         (the embedded engine; ``core.rollout.sampling``)
rollout_versions    (B, Tr)      float   one-step-off and streaming runs: the weight version (updates) that drew each
                                         token (a streamed sample may span versions: a partial rollout)
policy_version      (B,)         float   ... the version of the sample's oldest token
staleness           (B,)         float   ... updates between that version and the policy that trains on it
token_rewards       (B, Tr)      float   per-token reward: ``scores`` at the last valid token, minus KL penalty
advantages          (B, Tr)      float   advantage estimate per token
returns             (B, Tr)      float   value targets per token
uid                 (B,)         object  prompt-group id; the n samples of one prompt share it
data_source         (B,)         object  dataset name; selects the reward function
ground_truth        (B,)         object  reference answer for the reward
extra_info          (B,)         object  per-sample dict carried from the dataset
response_text       (B,)         object  the response decoded (``RolloutWorker.decode``; one-step-off batches carry it)
agent_answer        (B,)         object  an agent program's final answer (``rollout.agent.runner``): what the reward
                                         scores as the response
multi_modal_inputs  (B,)         object  image prompts: the sample's vision inputs, a dict of tensors with leading
                                         dim 1 (``core.data.vision_inputs``: pixel values for its image tokens)
messages            (B,)         object  SFT rows: the whole conversation to train on (``core.sft``), OpenAI messages
segment             (R, T)       long    supervised fine-tuning's packed rows (``core.sft``; ``input_ids`` and
                                         ``position_ids`` are then (R, T) too, positions restarting per sample):
                                         which sample of its row each token is, -1 on padding
loss_mask           (R, T)       float   ... 1 on the tokens the SFT loss trains (the assistant's)
==================  ===========  ======  =============================================================

Crossing processes: pickling turns each tensor into a numpy view of its bytes, so Ray stores it as an
out-of-band buffer and the receiver maps it without a copy. A received batch's tensors are therefore
views of Ray's shared, immutable object store: treat them as read-only (every op here returns a new
``Batch``; call ``.clone()`` before writing in place).
"""

from __future__ import annotations

import warnings
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch

KEYS: dict[str, str] = {
    "input_ids": "(B, T) long: prompt + response token ids",
    "attention_mask": "(B, T) long: 1 on real tokens",
    "position_ids": "(B, T) long: positions skipping left padding",
    "prompts": "(B, Tp) long: left-padded prompt ids",
    "responses": "(B, Tr) long: right-padded response ids",
    "response_mask": "(B, Tr) float: 1 on counted response tokens",
    "rollout_logprobs": "(B, Tr) float: sampled tokens' log-probs in the rollout engine",
    "old_logprobs": "(B, Tr) float: log-probs under the actor before the update",
    "old_from_update": "(B,) bool: old_logprobs left to the update's first forward (0 until it runs)",
    "ref_logprobs": "(B, Tr) float: log-probs under the reference policy",
    "teacher_logprobs": "(B, Tr) float: log-probs under the distillation teacher",
    "entropy": "(B, Tr) float: per-token entropy",
    "values": "(B, Tr) float: critic values",
    "scores": "(B,) float: outcome reward per sample",
    "rm_scores": "(B,) float: the reward model's score per sample",
    "function_scores": "(B,) float: with a reward model, the reward function's score per sample",
    "prm_logprobs": "(B, Tr) float: log-probs under the implicit PRM",
    "process_rewards": "(B, Tr) float: the implicit PRM's dense rewards",
    "num_turns": "(B,) float: agent rollouts, model turns per trajectory",
    "num_tool_calls": "(B,) float: agent rollouts, tool calls per trajectory",
    "num_tool_errors": "(B,) float: agent rollouts, failed tool calls per trajectory",
    "truncated": "(B,) float: agent rollouts, 1 when the last turn did not end at EOS",
    "rollout_seeds": "(B,) long: each sample's seed (token t drawn with token_uniforms(seed, t))",
    "rollout_versions": "(B, Tr) float: async runs, the weight version that drew each token",
    "policy_version": "(B,) float: async runs, the weight version of the sample's oldest token",
    "staleness": "(B,) float: async runs, updates between that version and the training policy",
    "token_rewards": "(B, Tr) float: per-token reward",
    "advantages": "(B, Tr) float: advantages",
    "returns": "(B, Tr) float: value targets",
    "uid": "(B,) object: prompt-group id",
    "data_source": "(B,) object: dataset name, selects the reward",
    "ground_truth": "(B,) object: reference answer",
    "extra_info": "(B,) object: per-sample dict",
    "response_text": "(B,) object: the decoded response",
    "agent_answer": "(B,) object: an agent program's final answer (rollout.agent.runner), what the reward scores",
    "multi_modal_inputs": "(B,) object: image prompts, the sample's vision inputs (dict of tensors)",
    "messages": "(B,) object: SFT rows, the whole conversation to train on",
    "segment": "(R, T) long: SFT packed rows, each token's sample in its row (-1: padding)",
    "loss_mask": "(R, T) float: SFT packed rows, 1 on the trained tokens",
}

# numpy has no bfloat16/float8: such tensors travel as same-width integers and are viewed back.
_NUMPY_CARRIER = {2: torch.int16, 1: torch.uint8, 4: torch.int32, 8: torch.int64}


def _object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-D object array, element by element (so equal-length lists stay lists, not a 2-D array)."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def _tensor_to_numpy(t: torch.Tensor) -> tuple[np.ndarray, torch.dtype]:
    t = t.detach().cpu().contiguous()
    try:
        return t.numpy(), t.dtype
    except TypeError:  # bf16, fp8, ...
        return t.view(_NUMPY_CARRIER[t.element_size()]).numpy(), t.dtype


def _numpy_to_tensor(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    with warnings.catch_warnings():  # Ray hands us read-only views; see the module docstring
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        t = torch.from_numpy(a)
    return t if t.dtype == dtype else t.view(dtype)


def _rebuild(tensors, dtypes, non_tensors, meta) -> "Batch":
    return Batch({k: _numpy_to_tensor(a, dtypes[k]) for k, a in tensors.items()}, non_tensors, meta)


class Batch:
    """Samples along dim 0: tensors, non-tensor columns and a meta dict. See the module docstring."""

    __slots__ = ("tensors", "non_tensors", "meta")

    def __init__(self, tensors: dict[str, torch.Tensor] | None = None,
                 non_tensors: dict[str, Any] | None = None, meta: dict[str, Any] | None = None):
        self.tensors: dict[str, torch.Tensor] = dict(tensors or {})
        self.non_tensors: dict[str, np.ndarray] = {
            k: v if isinstance(v, np.ndarray) and v.dtype == object else _object_array(v)
            for k, v in (non_tensors or {}).items()
        }
        self.meta: dict[str, Any] = dict(meta or {})
        self._check_lengths()

    # ---------------------------------------------------------------- basics
    def _check_lengths(self) -> None:
        sizes = {k: v.shape[0] for k, v in self.tensors.items() if v.dim() > 0}
        sizes |= {k: len(v) for k, v in self.non_tensors.items()}
        scalar = [k for k, v in self.tensors.items() if v.dim() == 0]
        if scalar:
            raise ValueError(f"Batch tensors need a batch dim 0; got 0-d tensor(s) {scalar} (put scalars in meta)")
        if len(set(sizes.values())) > 1:
            raise ValueError(f"Batch columns disagree on batch size: {sizes}")

    def __len__(self) -> int:
        for v in self.tensors.values():
            return v.shape[0]
        for v in self.non_tensors.values():
            return len(v)
        return 0

    def keys(self) -> list[str]:
        return [*self.tensors, *self.non_tensors]

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.non_tensors

    def __getitem__(self, key):
        if isinstance(key, str):
            if key in self.tensors:
                return self.tensors[key]
            if key in self.non_tensors:
                return self.non_tensors[key]
            raise KeyError(f"Batch has no key {key!r}; it has {self.keys()}")
        return self.index(key)

    def __setitem__(self, key: str, value) -> None:
        """Add or replace one column; its length must match the batch's."""
        if not isinstance(value, torch.Tensor) and not (isinstance(value, np.ndarray) and value.dtype == object):
            value = _object_array(value)
        others = [k for k in self.keys() if k != key]
        if others and len(value) != len(self[others[0]]):
            raise ValueError(f"column {key!r} has {len(value)} rows, the batch has {len(self[others[0]])}")
        self.tensors.pop(key, None)
        self.non_tensors.pop(key, None)
        (self.tensors if isinstance(value, torch.Tensor) else self.non_tensors)[key] = value

    def require(self, *keys: str) -> None:
        """Raise naming every missing key (a registry entry states its inputs this way)."""
        missing = [k for k in keys if k not in self]
        if missing:
            raise KeyError(f"Batch is missing key(s) {missing}; it has {self.keys()}")

    def __repr__(self) -> str:
        cols = [f"{k}:{tuple(v.shape)}:{str(v.dtype).removeprefix('torch.')}" for k, v in self.tensors.items()]
        cols += [f"{k}:object" for k in self.non_tensors]
        return f"Batch(len={len(self)}, {', '.join(cols)}, meta={sorted(self.meta)})"

    # ---------------------------------------------------------------- column ops
    def select(self, *keys: str, meta: bool = True) -> "Batch":
        self.require(*keys)
        return Batch({k: v for k, v in self.tensors.items() if k in keys},
                     {k: v for k, v in self.non_tensors.items() if k in keys},
                     self.meta if meta else None)

    def union(self, other: "Batch") -> "Batch":
        """Columns of both; a key present in both must hold equal values, else ValueError naming it."""
        if len(self) != len(other) and self.keys() and other.keys():
            raise ValueError(f"union of batches of different lengths {len(self)} and {len(other)}")
        tensors, non_tensors = dict(self.tensors), dict(self.non_tensors)
        for k, v in other.tensors.items():
            if k in tensors and not (tensors[k].shape == v.shape and torch.equal(tensors[k], v)):
                raise ValueError(f"union: key {k!r} is in both batches with different values")
            tensors[k] = v
        for k, v in other.non_tensors.items():
            if k in non_tensors and not np.array_equal(non_tensors[k], v):
                raise ValueError(f"union: key {k!r} is in both batches with different values")
            non_tensors[k] = v
        for k in other.meta.keys() & self.meta.keys():
            if other.meta[k] != self.meta[k]:
                raise ValueError(f"union: meta key {k!r} differs ({self.meta[k]!r} vs {other.meta[k]!r})")
        return Batch(tensors, non_tensors, self.meta | other.meta)

    # ---------------------------------------------------------------- row ops
    def index(self, idx) -> "Batch":
        """Rows by a slice, an int list / LongTensor / ndarray of indices, or a bool mask."""
        if isinstance(idx, slice):
            np_idx, t_idx = idx, idx
        else:
            np_idx = idx.cpu().numpy() if isinstance(idx, torch.Tensor) else np.asarray(idx)
            if np_idx.dtype == bool:
                np_idx = np.nonzero(np_idx)[0]
            t_idx = torch.as_tensor(np_idx, dtype=torch.long)
        return Batch({k: v[t_idx.to(v.device) if isinstance(t_idx, torch.Tensor) else t_idx]
                      for k, v in self.tensors.items()},
                     {k: v[np_idx] for k, v in self.non_tensors.items()}, self.meta)

    def reorder(self, perm: torch.Tensor | Sequence[int]) -> "Batch":
        """Rows in the order of a permutation (a full one: every row exactly once)."""
        perm = torch.as_tensor(perm, dtype=torch.long)
        if perm.numel() != len(self) or not torch.equal(perm.sort().values, torch.arange(len(self))):
            raise ValueError(f"reorder needs a permutation of range({len(self)})")
        return self.index(perm)

    @staticmethod
    def concat(batches: Iterable["Batch"]) -> "Batch":
        """Rows of all batches in order; all must have the same keys. Meta is taken from the first."""
        batches = list(batches)
        if not batches:
            raise ValueError("concat of no batches")
        keys = batches[0].keys()
        for i, b in enumerate(batches[1:], 1):
            if sorted(b.keys()) != sorted(keys):
                raise ValueError(f"concat: batch {i} has keys {b.keys()}, batch 0 has {keys}")
        first = batches[0]
        return Batch({k: torch.cat([b.tensors[k] for b in batches]) for k in first.tensors},
                     {k: np.concatenate([b.non_tensors[k] for b in batches]) for k in first.non_tensors},
                     first.meta)

    def chunk(self, n: int) -> list["Batch"]:
        """n equal parts in order. len(self) must divide by n: use ``pad_to_multiple`` first."""
        if n <= 0 or len(self) % n:
            raise ValueError(f"chunk: batch of {len(self)} does not split into {n} equal parts; pad_to_multiple({n}) first")
        return self.split(len(self) // n)

    def split(self, size: int) -> list["Batch"]:
        """Consecutive parts of ``size`` rows (the last may be shorter)."""
        if size <= 0:
            raise ValueError(f"split size must be positive, got {size}")
        return [self.index(slice(i, i + size)) for i in range(0, len(self), size)]

    def pad_to_multiple(self, n: int) -> tuple["Batch", int]:
        """Append rows repeated from the start until len divides by n. Returns (padded, pad); undo with unpad."""
        pad = -len(self) % n
        if pad == 0:
            return self, 0
        if len(self) == 0:
            raise ValueError("cannot pad an empty batch")
        idx = torch.arange(len(self) + pad) % len(self)
        return self.index(idx), pad

    def unpad(self, pad: int) -> "Batch":
        return self if pad == 0 else self.index(slice(0, len(self) - pad))

    def reindex_(self, idx: torch.Tensor) -> None:
        """In place: this batch's rows become ``self.index(idx)``. For a phase that resamples the step's batch
        (PF-PPO) and whose callers keep their variable; every other op returns a new Batch."""
        picked = self.index(idx)
        self.tensors, self.non_tensors = picked.tensors, picked.non_tensors

    def repeat(self, n: int, interleave: bool = True) -> "Batch":
        """n copies of every row: interleaved ``a a b b`` (group sampling keeps a group adjacent) or tiled ``a b a b``."""
        idx = torch.arange(len(self))
        idx = idx.repeat_interleave(n) if interleave else idx.repeat(n)
        return self.index(idx)

    def minibatches(self, size: int, seed: int, epochs: int = 1, shuffle: bool = True,
                    drop_last: bool = False) -> Iterator["Batch"]:
        """Yield mini-batches of ``size`` rows, a new seeded shuffle per epoch (reproducible from ``seed``)."""
        gen = torch.Generator().manual_seed(seed)
        for _ in range(epochs):
            order = torch.randperm(len(self), generator=gen) if shuffle else torch.arange(len(self))
            for start in range(0, len(self), size):
                rows = order[start:start + size]
                if drop_last and len(rows) < size:
                    break
                yield self.index(rows)

    # ---------------------------------------------------------------- devices and copies
    def to(self, device: torch.device | str) -> "Batch":
        return Batch({k: v.to(device) for k, v in self.tensors.items()}, self.non_tensors, self.meta)

    def clone(self) -> "Batch":
        """A private, writable copy of every tensor (received batches are read-only views)."""
        return Batch({k: v.clone() for k, v in self.tensors.items()},
                     {k: v.copy() for k, v in self.non_tensors.items()}, dict(self.meta))

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.tensors.values())

    def __reduce__(self):
        arrays, dtypes = {}, {}
        for k, v in self.tensors.items():
            arrays[k], dtypes[k] = _tensor_to_numpy(v)
        return _rebuild, (arrays, dtypes, self.non_tensors, self.meta)
