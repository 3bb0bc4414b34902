"""FSDP2 train engine: the actor (and, without an optimizer, the reference policy) as a worker role.

Sharding, optimizer and checkpoints: ``core.train.sharding`` (shared with the critic). Parameters stay fp32
(the optimizer's master copy); ``dtype`` sets the compute dtype through FSDP2's mixed-precision policy (on one
rank without offload or checkpointing, where there is nothing to shard: ``core.train.one_rank``, the same numbers).

Batch sizes: ``ppo_mini_batch_size`` samples make one optimizer step across the whole DP group; each rank
cuts its share into micro-batches of ``micro_batch_size`` samples, or -- with ``max_tokens_per_micro`` > 0 --
into micro-batches of at most that many tokens (dynamic batching). Losses are normalised by the mini-batch's
global token/sequence counts (all-reduced), so the split does not change the gradient. The log-prob pass and the
update are the policy role's (``core.train.policy.PolicyWorker``); this file holds what is FSDP2's.
"""

from __future__ import annotations

from typing import Iterator

import torch

from core.config import ActorConfig
from core.train import lora
from core.train.exact import available as exact_unavailable, response_logprobs_exact
from core.train.forward import response_logprobs
from core.train.moe import RouterStats
from core.train.policy import PolicyWorker, bucket_names
from core.train.micro_batches import global_counts
from core.train.sharding import FSDPEngine, IdleOffload, adamw_with_warmup, load_sharded_causal_lm
from core.train.ulysses import sequence_parallel, sp_logprobs
from core.protocol import Batch
from core.weight_delta import Bucket, encode
from core.worker import WorkerContext


def local_shard(p: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A parameter's rows on this rank and the flat offset of the first in the full tensor: FSDP2 shards dim 0 in
    chunks of ceil(rows / ranks) (``torch.chunk``), so rank r holds rows from r * chunk on (fewer, or none, at the
    end)."""
    if not hasattr(p, "to_local"):
        return p.detach(), 0
    local, mesh, rows = p.to_local(), p.device_mesh, p.shape[0]
    first = min(mesh.get_local_rank() * -(-rows // mesh.size()), rows)
    if local.shape[0] != min(-(-rows // mesh.size()), rows - first) or local.shape[1:] != p.shape[1:]:
        raise RuntimeError(f"unexpected FSDP2 shard {tuple(local.shape)} of {tuple(p.shape)}: not dim-0 chunks")
    return local, first * (p.numel() // max(rows, 1))


def full_tensor(p: torch.Tensor) -> torch.Tensor:
    """A parameter's full value: a DTensor's all-gather -- on a one-rank mesh its local tensor, which is the whole
    of it (no collective, no copy: DTensor's redistribute costs ~65 us of Python per parameter) -- or the tensor."""
    if not hasattr(p, "full_tensor"):
        return p.detach()
    if p.device_mesh.size() == 1 and p.to_local().shape == p.shape:
        return p.to_local().detach()
    return p.full_tensor()


class FSDPActor(FSDPEngine, PolicyWorker):
    """A policy on FSDP2: log-probs for any batch; PPO-style updates when trainable (``core.train.policy``)."""

    def __init__(self, ctx: WorkerContext, cfg: ActorConfig, exact: bool = False):
        """``exact``: the forward on the rollout engine's CPU kernels (``core.train.exact``,
        ``rollout.exact_logprobs``)."""
        from core.models import resolve_dtype

        self.ctx, self.cfg, self.exact = ctx, cfg, exact
        torch.manual_seed(cfg.seed)
        self.compute_dtype = resolve_dtype(cfg.dtype, ctx.device)
        if exact and (why := exact_unavailable(self.compute_dtype)):
            raise RuntimeError(f"rank {ctx.rank}: rollout.exact_logprobs cannot run here: {why}")
        self.model = load_sharded_causal_lm(cfg.model, ctx, self.compute_dtype, cfg.offload, "actor",
                                            cfg.gradient_checkpointing, lora=cfg.lora)
        # Ulysses: groups of ulysses_sp consecutive ranks share rows (dispatch gives them the same chunk)
        self.sp = sequence_parallel(self.model, ctx, cfg.ulysses_sp) if cfg.ulysses_sp > 1 else None
        self.dp = ctx.world_size // cfg.ulysses_sp
        self.optim = self.sched = None
        if cfg.trainable:
            self.optim, self.sched = adamw_with_warmup(self.model, cfg.optim)
        self.idle = IdleOffload(self.model, self.optim, ctx.device, cfg.offload == "idle")
        self._filled_old: torch.Tensor | None = None  # old log-probs as the last update used them
        self.routers = RouterStats(self.model)  # an MoE model's router loads while it updates
        self.lora_scales = lora.scales(self.model) if cfg.lora.rank else {}  # the engine gets W + scale B A
        # LoRA: engine weight name -> the parameters it is made of (an adapted linear's base weight and adapters)
        self.lora_units: dict[str, list[str]] = {}
        for name, _ in self.model.named_parameters() if cfg.lora.rank else ():
            self.lora_units.setdefault(lora.export_name(name), []).append(name)
        # delta syncs: each weight's shard as the rollout engine holds it (in its dtype), and the sync that sent it
        self.shadows: dict[str, tuple[str, torch.Tensor]] = {}

    # ------------------------------------------------------------------------------------ engine hooks
    def _forward(self, mb: Batch, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.exact:
            return response_logprobs_exact(self.model, mb, self.cfg.temperature, with_entropy, self.cfg.remove_padding,
                                           self.cfg.share_prompt)
        if self.sp is not None:
            return sp_logprobs(self.model, mb, self.sp, self.cfg.temperature, with_entropy)
        return response_logprobs(self.model, mb, self.cfg.temperature, with_entropy, self.cfg.remove_padding,
                                 self.cfg.share_prompt)

    def _step(self) -> float:
        if self.sp is not None:  # FSDP averaged over all ranks; a group's parts must add up (core.train.ulysses)
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(self.sp.size)
        return super()._step()

    def _counts(self, mask: torch.Tensor) -> tuple[float, float]:
        tokens, seqs = global_counts(mask, self.ctx.device)
        return tokens / self.cfg.ulysses_sp, seqs / self.cfg.ulysses_sp  # a group's ranks hold the same rows

    # ------------------------------------------------------------------------------------ weight export
    @torch.no_grad()
    def bucket_plan(self, bucket_bytes: int = 64 << 20, changed_only: bool = False) -> list[list[str]]:
        """Parameter names grouped into buckets of about ``bucket_bytes`` of full tensors (the same on every rank);
        with LoRA the engine's names (an adapted linear's base weight and adapters become one merged weight).
        ``changed_only``: the weights with a trainable part (with LoRA: the adapted linears; the embedding, norms
        and unadapted linears stay as the first sync sent them)."""
        params = dict(self.model.named_parameters())   # a DTensor's numel is the full tensor's
        units = self.lora_units or {n: [n] for n in params}
        return bucket_names(((n, params[parts[0]].numel() * params[parts[0]].element_size())
                             for n, parts in units.items()
                             if not changed_only or any(params[p].requires_grad for p in parts)), bucket_bytes)

    def weight_buckets(self, bucket_bytes: int = 64 << 20, changed_only: bool = False
                       ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Full (unsharded) parameters, gathered one bucket at a time. Collective: every rank must iterate."""
        with self.idle.on_gpu():
            params = dict(self.model.named_parameters())
            for names in self.bucket_plan(bucket_bytes, changed_only):
                if self.lora_scales:
                    yield self._merged(names, params)
                else:
                    yield [(n, full_tensor(params[n])) for n in names]

    @torch.no_grad()
    def gather_bucket(self, names: list[str], dtype: str | None = None) -> list[tuple[str, torch.Tensor]] | None:
        """Collective: every rank gathers these full parameters; rank 0 returns them on CPU (cast to ``dtype``, the
        receiving engine's, to halve the bytes that travel), the others None. For a rollout on another pool (with
        ``offload=idle`` the shards stay on the GPU from the first bucket until the actor's next call parks them)."""
        out = []
        with self.idle.on_gpu(park=False):
            params = dict(self.model.named_parameters())
            pairs = (self._merged(names, params) if self.lora_scales
                     else ((n, full_tensor(params[n])) for n in names))
            for n, full in pairs:
                if self.ctx.rank == 0:
                    out.append((n, full.to("cpu", getattr(torch, dtype) if dtype else full.dtype)))
        return out if self.ctx.rank == 0 else None

    def sends_shards(self) -> bool:
        return not self.lora_scales  # an adapted linear's W + scale B A needs the full adapters

    @torch.no_grad()
    def shard_bucket(self, names: list[str], dtype: str, base: str | None, sync_id: str) -> Bucket:
        params, cast = dict(self.model.named_parameters()), getattr(torch, dtype)
        parts, changed, total = [], 0, 0
        with self.idle.on_gpu(park=False):
            for n in names:
                local, offset = local_shard(params[n])
                new = local.detach().to(dtype=cast, copy=True).reshape(-1)
                shadow = self.shadows.get(n)
                part, c = encode(n, tuple(params[n].shape), offset, new, shadow and shadow[1].to(new.device),
                                 delta=base is not None and shadow is not None and shadow[0] == base)
                # beside the shards: on their device, or in host memory where they are offloaded
                self.shadows[n] = (sync_id, new if self.cfg.offload == "none" else new.cpu())
                parts.append(part)
                changed, total = changed + c, total + new.numel()
        return Bucket(parts, base if any(p.k >= 0 for p in parts) else None, changed, total).seal()

    def _merged(self, names: list[str], params: dict) -> list[tuple[str, torch.Tensor]]:
        """Collective: the engine weights ``names`` (LoRA), each adapted one W + scale B A from the full tensors."""
        full = {p: full_tensor(params[p]) for n in names for p in self.lora_units[n]}
        merged = lora.merged(full, self.lora_scales)
        return [(n, merged[n]) for n in names]
