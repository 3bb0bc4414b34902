"""Shared-prompt forward: the n samples of a prompt go through the model as one row, the prompt encoded once.

A GRPO batch holds each prompt n times. The standard teacher-forced forward encodes every copy: n (P + R) tokens
per group. Here a group is one row ``[prompt | response 1 | ... | response n]`` of P + nR tokens, with a block
mask: the prompt is causal within itself, and response j sees the whole prompt and itself (causally), never
another response. Each response keeps its own position ids (they restart at the prompt's length), so every
token sees exactly the keys, at exactly the positions, it sees in its own row: the log-probs and gradients are
those of the standard forward (up to float summation order), for causal attention. The prompt's hidden states
then receive the gradient of all n responses, as the n copies' gradients summed. (The idea is published as
"Prefix Grouper", 2025.) In the CPU demo the prompt is ~45 of ~70 tokens per sample: with n = 4 a group runs
~145 tokens instead of ~280.

Layout of one row (widths after ``trim_padding``: P prompt columns, left-padded; R response columns, right-
padded; G = the largest group of the micro-batch)::

    [ prompt (P) | slot 0 (R) | slot 1 (R) | ... | slot G-1 (R) ]

A smaller group leaves its last slots empty (masked). Every row has the same layout, so the positions whose
logits are needed are the same for every row and go to the model as one ``logits_to_keep`` index tensor: the
prompt's last column (it predicts every sample's first token) and the first R - 1 columns of each slot.

Attention by parts (``Parts``, where the model runs ``core.train.train_attention``): the block mask is dense
over W = P + G R columns, yet a slot's queries see only P + R of them. The prompt attends causally to itself
(N x P x P scores) and each slot to the prompt's keys and its own ((N G) x R x (P + R)): with GSM8K-length
prompts, n = 8 and 128-token responses that is 22% of the dense block mask's scores, the work of the standard
layout's attention. Same keys for every query, so the same softmax up to summation order."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from core.train.lm_head import head_logprobs
from core.train.train_attention import NAME
from core.protocol import Batch


def prompt_groups(batch: Batch) -> list[list[int]]:
    """Runs of consecutive rows with the same prompt (tokens, padding and positions), as lists of row indices, in
    the batch's order (rows of one prompt that are not adjacent form separate groups, which is still exact)."""
    Tp = batch["input_ids"].shape[1] - batch["responses"].shape[1]
    prompt = torch.cat([batch[k][:, :Tp].long() for k in ("input_ids", "attention_mask", "position_ids")], dim=1)
    same = (prompt[1:] == prompt[:-1]).all(-1).tolist()
    groups = [[0]]
    for i, s in enumerate(same, start=1):
        if s:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def pack(batch: Batch, groups: list[list[int]], flat: bool = False) -> dict[str, torch.Tensor]:
    """The packed model inputs of ``batch`` (already trimmed of padding columns) for these row groups:
    ``input_ids``, ``position_ids`` (rows, P + G R), the block mask ``allowed`` (rows, 1, W, W) as bools
    (query, key), ``keep`` (1 + G (R - 1),): the columns whose logits are needed, ``take`` (B, R): for each
    original row and response token, the index into ``keep`` of the logits that predict it, ``group`` (B,):
    each original row's packed row, and ``parts``: the layout for attention by parts.

    ``flat``: the real tokens alone, as one row (``_flatten``): no padding goes through the model's linears."""
    B, W0 = batch["input_ids"].shape
    R = batch["responses"].shape[1]
    P, G, N = W0 - R, max(len(g) for g in groups), len(groups)
    W = P + G * R
    ids = torch.zeros(N, W, dtype=batch["input_ids"].dtype)
    pos = torch.zeros(N, W, dtype=batch["position_ids"].dtype)
    valid = torch.zeros(N, W, dtype=torch.bool)
    for r, rows in enumerate(groups):
        first = rows[0]
        ids[r, :P], pos[r, :P] = batch["input_ids"][first, :P], batch["position_ids"][first, :P]
        valid[r, :P] = batch["attention_mask"][first, :P].bool()
        for j, b in enumerate(rows):
            cols = slice(P + j * R, P + (j + 1) * R)
            ids[r, cols], pos[r, cols] = batch["input_ids"][b, P:], batch["position_ids"][b, P:]
            valid[r, cols] = batch["attention_mask"][b, P:].bool()
    slot = torch.cat([torch.full((P,), -1), torch.arange(G).repeat_interleave(R)])      # (W,): -1 = prompt
    col = torch.arange(W)
    structure = (col[None, :] <= col[:, None]) & ((slot[None, :] == -1) | (slot[None, :] == slot[:, None]))
    allowed = structure[None] & valid[:, None, :]
    allowed |= torch.eye(W, dtype=torch.bool)[None]   # a padding query sees itself: no all-masked row (NaN)
    keep = torch.cat([torch.tensor([P - 1])] + [P + j * R + torch.arange(R - 1) for j in range(G)])
    take = torch.zeros(B, R, dtype=torch.long)
    group = torch.zeros(B, dtype=torch.long)
    for r, rows in enumerate(groups):
        for j, b in enumerate(rows):
            take[b, 1:] = 1 + j * (R - 1) + torch.arange(R - 1)  # take[b, 0] = 0: the prompt's last column
            group[b] = r
    p = {"input_ids": ids, "position_ids": pos, "allowed": allowed[:, None], "keep": keep, "take": take,
         "group": group, "parts": Parts.of(allowed[:, None], P, G, R)}
    return _flatten(p, valid) if flat else p


def _flatten(p: dict, valid: torch.Tensor) -> dict:
    """The packed rows' real tokens (``valid``: (N, W)) as one row of T tokens, in row-major order: the model's
    linears, norms and MLPs then see no padding (in the short GRPO bench a micro-batch's responses, padded to the
    longest, were ~30% padding). Attention by parts gathers each part's padded layout from the flat tokens and
    scatters its outputs back (``Parts.gather`` / ``scatter``): the same queries, keys, masks and positions, so
    the same numbers. ``keep`` and ``take`` then index the flat row; a padding response token (masked downstream)
    takes the first kept position. No ``allowed``: attention by parts does not read the block mask."""
    N, W = valid.shape
    order = valid.flatten().nonzero().squeeze(1)                      # (T,) each real token's packed position
    gather = torch.zeros(N * W, dtype=torch.long)                     # packed position -> flat token (pads: 0)
    gather[order] = torch.arange(len(order))
    kept = torch.arange(N)[:, None] * W + p["keep"][None, :]          # (N, K) packed positions of needed logits
    real = valid.flatten()[kept]                                      # (N, K)
    index = (real.flatten().cumsum(0) - 1).view_as(real)              # each real kept position's index in keep
    g, t = p["group"][:, None], p["take"]
    return {"input_ids": p["input_ids"].flatten()[order][None],
            "position_ids": p["position_ids"].flatten()[order][None],
            "allowed": None, "keep": gather[kept[real]], "take": torch.where(real[g, t], index[g, t], 0),
            "group": torch.zeros_like(p["group"]),
            "parts": dataclasses.replace(p["parts"], gather=gather, scatter=order)}


@dataclass(frozen=True)
class Parts:
    """A packed batch's layout for attention by parts: P prompt columns, G slots of R columns; ``prompt_mask``
    (N, 1, P, P) and ``slot_mask`` (N G, 1, R, P + R) bools, each query's allowed keys (``pack``'s block mask cut
    to the keys a part can see: the prompt's, then its slot's)."""
    P: int
    G: int
    R: int
    prompt_mask: torch.Tensor
    slot_mask: torch.Tensor
    gather: torch.Tensor | None = None    # flat rows (``_flatten``): packed position -> flat token
    scatter: torch.Tensor | None = None   # flat token -> packed position

    @staticmethod
    def of(allowed: torch.Tensor, P: int, G: int, R: int) -> "Parts":
        a = allowed[:, 0]                                                        # (N, W, W)
        slots = [a[:, P + j * R:P + (j + 1) * R] for j in range(G)]              # slot j's query rows
        slot_mask = torch.stack([torch.cat([q[..., :P], q[..., P + j * R:P + (j + 1) * R]], -1)
                                 for j, q in enumerate(slots)], 1)               # (N, G, R, P + R)
        return Parts(P, G, R, a[:, None, :P, :P], slot_mask.flatten(0, 1)[:, None])

    def to(self, device: torch.device) -> "Parts":
        move = lambda t: None if t is None else t.to(device)
        return Parts(self.P, self.G, self.R, *map(move, (self.prompt_mask, self.slot_mask, self.gather, self.scatter)))

    def unflatten(self, x: torch.Tensor) -> torch.Tensor:
        """A flat row's (1, H, T, D) -> the packed rows' (N, H, W, D); padding positions hold token 0's."""
        W = self.P + self.G * self.R
        rows = TakeRows.apply(x[0].transpose(0, 1), self.gather)                # (N W, H, D)
        return rows.view(-1, W, *rows.shape[1:]).transpose(1, 2)

    def flatten(self, out: torch.Tensor) -> torch.Tensor:
        """Attention outputs of the packed rows (N, W, H, D) -> the flat row's real tokens' (1, T, H, D)."""
        return TakeRows.apply(out.flatten(0, 1), self.scatter)[None]

    def attend(self, attend, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """``attend(q, k, v, mask) -> (B, q, H, D)`` run on the prompt and on the slots separately; the packed rows'
        (N, W, H, D) output. The training attention (``core.train.train_attention``) calls it with its kernel."""
        if self.gather is not None:  # a flat row: the packed layout first, the real tokens' outputs back at the end
            query, key, value = map(self.unflatten, (query, key, value))
        q_prompt, q_slots = self.split(query)
        prompt = attend(q_prompt, key[:, :, :self.P], value[:, :, :self.P], self.prompt_mask)
        slots = attend(q_slots, self.slot_keys(key), self.slot_keys(value), self.slot_mask)
        out = self.join(prompt, slots)
        return out if self.gather is None else self.flatten(out)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, H, W, D) -> the prompt's (N, H, P, D) and the slots' (N G, H, R, D)."""
        N, H, _, D = x.shape
        slots = x[:, :, self.P:].reshape(N, H, self.G, self.R, D).transpose(1, 2).reshape(N * self.G, H, self.R, D)
        return x[:, :, :self.P], slots

    def slot_keys(self, x: torch.Tensor) -> torch.Tensor:
        """(N, KVH, W, D) keys or values -> (N G, KVH, P + R, D): each slot's, after the prompt's."""
        prompt, slots = self.split(x)
        N, KVH, _, D = x.shape
        prompt = prompt[:, None].expand(N, self.G, KVH, self.P, D).reshape(N * self.G, KVH, self.P, D)
        return torch.cat([prompt, slots], dim=2)

    def join(self, prompt: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Attention outputs (N, P, H, D) and (N G, R, H, D) -> (N, W, H, D), the packed row's column order."""
        N = prompt.shape[0]
        return torch.cat([prompt, slots.reshape(N, self.G * self.R, *slots.shape[2:])], dim=1)


class TakeRows(torch.autograd.Function):
    """``x.index_select(0, index)`` whose backward adds the gradient's rows back with ``index_add_`` (repeated
    indices add up). Advanced indexing ``x[index]`` does the same math, but its backward is ``index_put_`` with
    accumulation, which ran 4x slower on CPU here: 0.3 s of a long-workload micro-batch's 13 s (flat rows)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(index)
        ctx.rows = x.shape[0]
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        index, = ctx.saved_tensors
        return grad.new_zeros(ctx.rows, *grad.shape[1:]).index_add_(0, index, grad), None


def attention_mask_4d(allowed: torch.Tensor, model) -> torch.Tensor:
    """The block mask as the model's attention takes a custom 4D mask: bools for SDPA and flex/flash kernels
    (True = attend), an additive float mask for eager attention (which adds the mask to the scores)."""
    if getattr(model.config, "_attn_implementation", "sdpa") != "eager":
        return allowed
    dtype = next(model.parameters()).dtype
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)


def shared_prompt_logits(model, batch: Batch, groups: list[list[int]]) -> torch.Tensor:
    """(B, R, V) logits that predict each row's R response tokens (``batch`` trimmed of padding), from one packed
    forward per prompt group; row order is the batch's."""
    p = _pack_for(model, batch, groups)
    device = batch["input_ids"].device
    out = _packed_forward(model, p, device)
    return out.logits[p["group"].to(device)[:, None], p["take"].to(device)]  # (groups, keep, V) -> (B, R, V)


def shared_prompt_logprobs(model, batch: Batch, groups: list[list[int]], head, temperature: float,
                           with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, R) log-probs of each row's response tokens (and entropies), the same packed forward with the LM head
    fused into the log-softmax (``core.train.lm_head``: no (positions x vocabulary) fp32 tensor; a training
    forward keeps one of the compute dtype for its backward)."""
    p = _pack_for(model, batch, groups)
    device = batch["input_ids"].device
    # target (b, t) is predicted by kept column take[b, t] of packed row group[b]
    pos = (p["group"][:, None] * len(p["keep"]) + p["take"]).reshape(-1).to(device)
    with head_logprobs(head, pos, batch["responses"].reshape(-1).to(device), temperature, with_entropy):
        out = _packed_forward(model, p, device).logits.view(*p["take"].shape, 2)
    return out[..., 0], out[..., 1] if with_entropy else None


def shared_prompt_values(model, batch: Batch, groups: list[list[int]]) -> torch.Tensor:
    """(B, R) outputs of a one-output head (a value model: ``AutoModelForTokenClassification``) at the positions
    that predict each row's R response tokens, from one packed forward per prompt group; row order is the batch's.
    Such a model computes its head at every position (no ``logits_to_keep``): one output each, so cheap."""
    p = _pack_for(model, batch, groups)
    device = batch["input_ids"].device
    out = _packed_forward(model, p, device, keep=False).logits[..., 0]           # (groups, packed width)
    return out[:, p["keep"].to(device)][p["group"].to(device)[:, None], p["take"].to(device)]


def _attends_by_parts(model) -> bool:
    """Does ``model`` run our training attention, which takes the layout and attends by parts?"""
    return getattr(model.config, "_attn_implementation", None) == NAME


def _pack_for(model, batch: Batch, groups: list[list[int]]) -> dict:
    """``pack``'s layout for ``model``: flat rows where it attends by parts and positions are text positions (a
    model with multi-axis positions keeps the padded rows)."""
    return pack(batch, groups, flat=_attends_by_parts(model) and batch["position_ids"].dim() == 2)


def _packed_forward(model, p: dict, device: torch.device, keep: bool = True):
    # our training attention takes the layout and attends by parts; any other ignores it (the dense block mask)
    by_parts = {"shared_prompt_parts": p["parts"].to(device)} if _attends_by_parts(model) else {}
    mask = None if p["allowed"] is None else attention_mask_4d(p["allowed"], model).to(device)
    return model(input_ids=p["input_ids"].to(device), position_ids=p["position_ids"].to(device),
                 attention_mask=mask, use_cache=False,
                 **({"logits_to_keep": p["keep"].to(device)} if keep else {}), **by_parts)
