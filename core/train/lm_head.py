"""Log-probs straight from the last hidden states: the LM head's projection, the log-softmax and the gather of the
sampled tokens, a block of the vocabulary at a time, in forward and in backward.

Why: the standard path materialises the (positions x vocabulary) logits, then an fp32 copy, its exp and, in
backward, the softmax and the gradient -- each 4 x positions x V bytes. For the long GRPO workload's micro-batch
(32 samples x 128 response tokens, V = 49,152) that is 805 MB per tensor, and the elementwise passes over them
took ~20% of the update on 2 CPU cores, more than all attention. Here the vocabulary goes in blocks of
``BLOCK_VALUES / positions`` columns (a cache-sized block of logits): each block is projected, turned into fp32
and folded into a running log-normaliser (and entropy) per position, the targets' logits picked from it, and the
block dropped -- the softmax of flash attention, over the vocabulary. A forward that will be differentiated keeps
its blocks' logits instead, in the one (positions x V) compute-dtype tensor that backward turns, block by block and in
place, into their gradient (what the standard path's backward also holds): no second LM-head matmul (it was a
quarter of the head's work: 0.6 s of a long-workload micro-batch's 13 s forward + backward). Backward forms the
gradient from

    d logp(i | h) / d x = onehot(i) - softmax(x),     d H / d x = -softmax(x) * (x - E_softmax[x]),

x = logits / T, into one (positions x V) tensor of the compute dtype (what the standard path's backward also
holds), then the hidden states' and the weight's gradients as one matmul each. Rounding as the standard path:
logits in the compute dtype (bf16 on bf16 CPUs), normalised in fp32, the logits' gradient rounded to the compute
dtype before the two matmuls.

On CPU each block's row work is one kernel pass per row (``csrc/lm_head.cpp``: ``head_fold`` -- max, exp-sum,
entropy moment and the targets' logits; ``head_grad`` -- the logits' gradient, rounded once), where the PyTorch ops
below make ~6 elementwise passes over (positions x block) fp32 temporaries. Alone, a long-workload micro-batch's head
(3,700 positions, bf16) went 0.98 -> 0.70 s forward (now at its matmuls' speed), 2.3 -> 2.1 s backward; in whole
phases, interleaved on one batch, the reference and old-log-prob passes took ~3% less and the update no measurable
time less. The PyTorch ops remain the path on GPUs and without the kernels (``HYBRIDRL_CPU_KERNELS=0``); both are
tested against the textbook values.

Targets are (position, token) pairs, several per position allowed: the shared-prompt layout's prompt position
predicts the first token of every sample of the group.

Used where the model's forward returns ``lm_head(hidden_states)`` untouched (``FUSED_MODEL_TYPES``: no logit
soft-capping or scaling after the head, no bias): the head's ``forward`` is swapped for the call's duration, so
the model -- and FSDP2's hooks around it -- run as usual, and the head's weight is the one in use at that moment
(FSDP2's unsharded parameter)."""

from __future__ import annotations

from contextlib import contextmanager

import torch

# model types whose causal-LM forward is ``logits = self.lm_head(hidden_states)`` and returns it as is (checked
# against transformers' modeling files); others keep the standard path
FUSED_MODEL_TYPES = {"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "qwen3_5", "phi3", "olmo2",
                     "smollm3", "qwen2_5_vl"}
# logits per vocabulary block: on CPU 2^21 fp32 values = 8 MB, in cache with their compute-dtype copy; on a GPU
# 2^25 (128 MB), where the blocks' many small kernels were the cost (an H100, 4,096 positions x 49,152 tokens, bf16
# forward + backward: 66 ms in blocks of 2^21, 14.6 ms in blocks of 2^25, peak memory 0.76 -> 1.4 GB)
BLOCK_VALUES = 1 << 21
GPU_BLOCK_VALUES = 1 << 25


def fused_head(model) -> torch.nn.Linear | None:
    """The model's LM head when its log-probs can be taken straight from the hidden states, else None."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if (getattr(model.config, "model_type", None) not in FUSED_MODEL_TYPES or type(head) is not torch.nn.Linear
            or head.bias is not None):
        return None
    return head


class HeadLogprobs(torch.autograd.Function):
    """hidden (M, D), weight (V, D), pos (Q,), ids (Q,) -> log softmax(hidden[pos] W^T / T)[ids] (Q,) fp32, and the
    entropy of softmax(hidden[pos] W^T / T) (Q,) fp32 (zeros unless ``with_entropy``)."""

    @staticmethod
    def forward(ctx, hidden, weight, pos, ids, temperature: float, with_entropy: bool, keep: bool = False):
        # keep: backward follows (grad mode was on at the call): the blocks' logits go into the (M, V) tensor that
        # backward overwrites with their gradient, instead of being recomputed there
        M, T = hidden.shape[0], temperature
        # (on ctx, not save_for_backward: backward overwrites it; saved-tensor hooks, e.g. offloading, do not see it)
        ctx.logits = torch.empty(M, weight.shape[0], dtype=hidden.dtype, device=hidden.device) if keep else None
        f32 = dict(dtype=torch.float32, device=hidden.device)
        # per position, in logit units (x T): the running max, the sum of exp(x - max), the sum of exp(x - max) x
        peak, total = torch.full((M,), -torch.inf, **f32), torch.zeros(M, **f32)
        moment = torch.zeros(M if with_entropy else 0, **f32)
        # the kernels' path: the targets grouped by row, once for forward and backward
        ctx.targets = _targets_by_row(pos, ids, M) if _on_kernels(hidden) else None
        if ctx.targets is not None:  # one pass per row and block, in cache (csrc/lm_head.cpp)
            order, row_ptr, tok = ctx.targets
            picked = torch.empty(pos.shape[0], **f32)
            for v0, _, logits in _blocks(hidden, weight, ctx.logits):
                _fold(logits, v0, peak, total, moment, with_entropy, row_ptr, tok, picked, T)
            target = torch.empty_like(picked).index_copy_(0, order, picked)
        else:
            target = torch.empty(pos.shape[0], **f32)
            for v0, v1, logits in _blocks(hidden, weight, ctx.logits):
                new_peak = torch.maximum(peak, logits.max(-1).values.float())
                rescale = ((peak - new_peak) / T).exp_()
                e = _exp((logits - new_peak[:, None]), T)            # fp32 by type promotion: no separate cast pass
                total = total * rescale + e.sum(-1)
                if with_entropy:
                    moment = moment * rescale + (e * logits).sum(-1)
                peak = new_peak
                q = ((ids >= v0) & (ids < v1)).nonzero()[:, 0]
                target[q] = logits[pos[q], ids[q] - v0].float()
        logz = (peak + T * total.log()) / T                      # log sum exp(logits / T)
        mean = moment / total / T if with_entropy else None      # E_softmax[logits / T]
        ctx.save_for_backward(hidden, weight, pos, ids, logz, mean)
        ctx.temperature = T
        return target / T - logz[pos], (logz - mean)[pos] if with_entropy else torch.zeros_like(target)

    @staticmethod
    def backward(ctx, grad_logp, grad_ent):
        hidden, weight, pos, ids, logz, mean = ctx.saved_tensors
        M, T = hidden.shape[0], ctx.temperature
        f32 = dict(dtype=torch.float32, device=hidden.device)
        # per position: the summed weight of its targets' log-probs, and of its entropy
        g_pos = torch.zeros(M, **f32).index_add_(0, pos, grad_logp.float())
        g_ent = (torch.zeros(M, **f32).index_add_(0, pos, grad_ent.float())
                 if mean is not None and grad_ent is not None else None)
        # the kept logits become their gradient in place (each block is read before it is written)
        kept, ctx.logits = ctx.logits, None
        grad_x = kept if kept is not None else torch.empty(M, weight.shape[0], dtype=hidden.dtype, device=hidden.device)
        blocks = _kept_blocks(kept, hidden) if kept is not None else _blocks(hidden, weight)
        if ctx.targets is not None:
            order, row_ptr, tok = ctx.targets
            val, logz_t = grad_logp.float()[order], logz * T
            with_ent = g_ent is not None
            g_ent, mean_t = (g_ent, mean * T) if with_ent else (logz_t.new_empty(0), logz_t.new_empty(0))
            for v0, v1, logits in blocks:
                _grad(logits, v0, logz_t, g_pos, g_ent, mean_t, with_ent, row_ptr, tok, val, grad_x[:, v0:v1], T)
        else:
            for v0, v1, logits in blocks:
                p = _exp(logits - (logz * T)[:, None], T)             # softmax(logits / T), fp32
                gx = p * -g_pos[:, None]                             # sum over targets of g (onehot(i) - p)
                q = ((ids >= v0) & (ids < v1)).nonzero()[:, 0]
                gx.index_put_((pos[q], ids[q] - v0), grad_logp[q].float(), accumulate=True)
                if g_ent is not None:
                    gx -= g_ent[:, None] * p * _scale(logits - (mean * T)[:, None], T)
                grad_x[:, v0:v1] = gx.div_(T)
        grad_hidden = grad_x @ weight if ctx.needs_input_grad[0] else None
        grad_weight = grad_x.T @ hidden if ctx.needs_input_grad[1] else None
        return grad_hidden, grad_weight, None, None, None, None, None


def _fold(*args) -> None:
    torch.ops.hybridrl_cpu.head_fold(*args)


def _grad(*args) -> None:
    torch.ops.hybridrl_cpu.head_grad(*args)


def _on_kernels(hidden: torch.Tensor) -> bool:
    """The block work on the fused CPU kernels (bf16 or fp32 on CPU, kernels built); else the PyTorch ops."""
    from core.kernels import cpu as cpu_kernels

    return (hidden.device.type == "cpu" and hidden.dtype in (torch.bfloat16, torch.float32)
            and cpu_kernels.available())


def _targets_by_row(pos: torch.Tensor, ids: torch.Tensor, M: int):
    """The targets grouped by position, as the kernels read them: (order: each CSR slot's target index, row_ptr
    (M + 1): row r's slots are row_ptr[r]:row_ptr[r + 1], tok: each slot's vocabulary id)."""
    order = torch.argsort(pos, stable=True)
    row_ptr = torch.zeros(M + 1, dtype=torch.long, device=pos.device)
    row_ptr[1:] = torch.bincount(pos, minlength=M).cumsum(0)
    return order, row_ptr, ids[order].contiguous()


def _blocks(hidden: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None):
    """(v0, v1, logits) for each block of vocabulary rows: the logits in the compute dtype, as the model's head
    gives them (the fp32 math on them promotes as it reads: a bf16 -> fp32 pass of its own cost as much as it).
    ``out`` (M, V): each block is written into its columns (and yielded as that view)."""
    for v0, v1 in _ranges(hidden, weight.shape[0]):
        if out is None:
            yield v0, v1, hidden @ weight[v0:v1].T
        else:
            yield v0, v1, torch.matmul(hidden, weight[v0:v1].T, out=out[:, v0:v1])


def _kept_blocks(logits: torch.Tensor, hidden: torch.Tensor):
    """``_blocks``' blocks as the forward kept them in ``logits`` (M, V)."""
    for v0, v1 in _ranges(hidden, logits.shape[1]):
        yield v0, v1, logits[:, v0:v1]


def _ranges(hidden: torch.Tensor, V: int):
    """The vocabulary blocks [v0, v1) for these (M, D) hidden states: ``BLOCK_VALUES`` logits each on CPU,
    ``GPU_BLOCK_VALUES`` on a GPU."""
    values = GPU_BLOCK_VALUES if hidden.device.type == "cuda" else BLOCK_VALUES
    step = max(1, values // max(1, hidden.shape[0]))
    for v0 in range(0, V, step):
        yield v0, min(V, v0 + step)


def _scale(x: torch.Tensor, T: float) -> torch.Tensor:
    return x.div_(T) if T != 1.0 else x


def _exp(x: torch.Tensor, T: float) -> torch.Tensor:
    return _scale(x, T).exp_()


@contextmanager
def head_logprobs(head: torch.nn.Linear, pos: torch.Tensor, ids: torch.Tensor, temperature: float,
                  with_entropy: bool):
    """Within the block the model's "logits" are (Q, 2): for each target, its log-prob and its position's entropy
    (zeros unless ``with_entropy``). ``pos`` (Q,) indexes the kept positions flattened over the rows (row x kept +
    column), ``ids`` (Q,) are the targets' tokens."""
    def forward(h: torch.Tensor) -> torch.Tensor:
        logp, ent = HeadLogprobs.apply(h.reshape(-1, h.shape[-1]), head.weight, pos, ids, temperature, with_entropy,
                                       torch.is_grad_enabled() and (h.requires_grad or head.weight.requires_grad))
        return torch.stack([logp, ent], dim=-1)

    head.forward = forward
    try:
        yield
    finally:
        del head.forward
