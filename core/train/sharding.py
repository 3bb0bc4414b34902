"""What the FSDP2 roles (actor, reference, critic) share: sharding a transformers model, the AdamW + warm-up
optimizer, one clipped optimizer step, and checkpoints of model + optimizer + scheduler + RNG.

Sharding: ``fully_shard`` on every decoder layer (the model's ``_no_split_modules`` classes) and on the root,
over a 1-D mesh of the group's ranks (gloo on CPU, nccl on GPU). Parameters stay fp32 (the optimizer's master
copy); the compute dtype comes from FSDP2's mixed-precision policy. On one rank (no offload, no activation
checkpointing) nothing is sharded: ``core.train.one_rank`` gives the same numbers without FSDP2's copies.
"""

from __future__ import annotations

from typing import Iterator

import math
import os
import warnings
from contextlib import contextmanager

import torch

from core.config import check_offload_mode
from core.train.one_rank import ComputeCopies, weights_changed
from core.worker import WorkerContext


# where a role's sharded fp32 weights, gradients and AdamW moments live (its config's ``offload``), on CUDA:
#   none  on the GPU always
#   idle  in host memory while the role is idle (the colocated rollout has the GPU); loaded to the GPU for each of
#         its calls, the optimizer steps on the GPU (verl's param_offload + optimizer_offload): one host<->GPU round
#         trip of the shards per call
#   full  in host memory always: each layer is copied in as it is computed and the optimizer steps on the CPU (FSDP2
#         CPUOffloadPolicy): the least GPU memory, and the slowest
def check_offload(mode: str, role: str, ctx: WorkerContext | None = None) -> None:
    """``mode`` is one of ``core.config.OFFLOAD_MODES`` and, given the rank's context, usable there (not none:
    CUDA only)."""
    check_offload_mode(mode, role)
    if ctx is not None and mode != "none" and ctx.device.type != "cuda":
        raise ValueError(f"{role}.offload={mode} moves FSDP shards to host memory and needs a CUDA device; rank "
                         f"{ctx.rank} runs on {ctx.device} (where everything is in host memory already)")


def unsharded(ctx: WorkerContext, offload: str, checkpointing: bool) -> bool:
    """One rank, no offload, no activation checkpointing: nothing to shard (``core.train.one_rank``)."""
    return ctx.world_size == 1 and offload == "none" and not checkpointing


def shard(model: torch.nn.Module, ctx: WorkerContext, compute: torch.dtype, offload: str, role: str,
          checkpointing: bool = False) -> torch.nn.Module:
    check_offload(offload, role, ctx)
    return model if unsharded(ctx, offload, checkpointing) else fsdp_wrap(model, ctx, compute, offload)


def fsdp_wrap(model: torch.nn.Module, ctx: WorkerContext, compute: torch.dtype, offload: str) -> torch.nn.Module:
    """FSDP2 over the group's ranks: every decoder layer, then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
    policy = CPUOffloadPolicy(pin_memory=True) if offload == "full" else OffloadPolicy()
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    layer_classes = set(getattr(model, "_no_split_modules", None) or [])  # transformers 5 unions its sub-models'
    # Idefics3's vision attention returns a view; its encoder layer adds the residual out of place (checked), so
    # FSDP2's per-forward warning that an in-place op would skip a hook does not apply
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .*VisionAttention\) returned a view")
    for module in model.modules():
        if type(module).__name__ in layer_classes:
            fully_shard(module, mesh=mesh, mp_policy=mp, offload_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=policy)
    return model


class IdleOffload:
    """``offload=idle``: moves a role's shards (and its optimizer's moments) between the host and its GPU.

    ``on_gpu(optim=...)`` around each call: loads what the call needs, parks everything after it, then releases
    the freed blocks of PyTorch's caching allocator (else the colocated engine could not use them). FSDP2 keeps a
    module's sharded parameters registered across ``module.to()`` (the same Parameter objects, so the optimizer's
    state stays keyed to them). AdamW's ``step`` counters stay on the host, where torch keeps them."""

    def __init__(self, model: torch.nn.Module, optim, device: torch.device, enabled: bool):
        self.model, self.optim, self.device, self.enabled = model, optim, device, enabled
        if enabled:
            self._move(torch.device("cpu"), with_optim=True)

    def _move(self, device: torch.device, with_optim: bool) -> None:
        self.model.to(device)
        if with_optim and self.optim is not None:
            for state in self.optim.state.values():
                for key, value in state.items():
                    if torch.is_tensor(value) and key != "step":
                        state[key] = value.to(device)
        if device.type == "cpu":
            torch.cuda.empty_cache()

    @contextmanager
    def on_gpu(self, optim: bool = False, park: bool = True):
        """The shards on the GPU for the body (and the optimizer state with ``optim``); parked after unless
        ``park=False`` (the next call parks them)."""
        if not self.enabled:
            yield
            return
        self._move(self.device, with_optim=optim)
        try:
            yield
        finally:
            if park:
                self._move(torch.device("cpu"), with_optim=optim)


def load_sharded_causal_lm(name_or_path: str, ctx: WorkerContext, compute: torch.dtype, offload: str, role: str,
                           checkpointing: bool = False, value_head: bool = False, lora=None) -> torch.nn.Module:
    """The model built on the meta device, sharded, then filled shard by shard from its safetensors files.

    Why: loading the full fp32 model on every rank first costs 4 P bytes per rank -- 131 GB per GPU for a 32B
    model, which no 80 GB GPU holds, and 1 TB of host memory per 8-GPU node. Here a rank reads only the rows of
    each tensor its shard holds (``safe_open(...).get_slice``; the files are memory-mapped and the page cache is
    shared by the node's ranks), so the peak is its fp32 shard. Buffers that are not in the checkpoint (rotary
    frequencies) are computed on the host at construction, as transformers does, and kept. A folder without
    safetensors files (or a hub id that cannot be fetched), or with tensor names other than the model's, falls
    back to the full load.

    ``value_head``: the critic's value model instead (the causal LM's backbone with a 1-output ``score`` head,
    ``core.models.load_value_model``); the head is not in the checkpoint and is drawn on the host as transformers
    initialises it (normal, std ``initializer_range``; bias 0) from this process's torch RNG, which the caller
    seeds alike on every rank."""
    from core.models import load_causal_lm, resolve_model

    files = _safetensors_files(resolve_model(name_or_path))
    model, where, fresh = (_meta_model(files, f"{role} rank {ctx.rank}", value_head, lora) if files
                           else (None, None, {}))
    if model is None:
        if value_head:
            from core.models import load_value_model

            model = load_value_model(name_or_path).to(ctx.device)
        else:
            model = load_causal_lm(name_or_path, dtype=torch.float32, device=ctx.device)
        if lora is not None and lora.rank:  # ``lora``: core.config.LoraConfig (core.train.lora)
            from core.train.lora import inject

            inject(model, lora)
    if torch.device(ctx.device).type == "cpu":  # matmul attention for short training sequences (train_attention)
        from core.train import train_attention

        model.set_attn_implementation(train_attention.NAME)
    if checkpointing:
        enable_checkpointing(model)
    if where is None:
        return _with_copies(shard(model, ctx, compute, offload, role, checkpointing), ctx, compute, offload,
                            checkpointing)
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    model = shard(model, ctx, compute, offload, role, checkpointing)
    model.to_empty(device="cpu" if offload == "full" else ctx.device)   # FSDP2 CPU offload keeps the shards on the host
    if unsharded(ctx, offload, checkpointing):
        model.tie_weights()  # to_empty replaced each registration of a tied weight with its own tensor
    for name, b in buffers.items():
        module, _, attr = name.rpartition(".")
        model.get_submodule(module)._buffers[attr] = b.to(ctx.device)
    _fill_shards(model, where, fresh)
    return _with_copies(model.eval(), ctx, compute, offload, checkpointing)


def _with_copies(model: torch.nn.Module, ctx: WorkerContext, compute: torch.dtype, offload: str,
                 checkpointing: bool) -> torch.nn.Module:
    """An unsharded model computing in a lower dtype gets its compute copies (after ``to_empty``, which replaces
    meta parameters with new ones)."""
    if unsharded(ctx, offload, checkpointing) and compute != torch.float32:
        ComputeCopies(model, compute)
    return model


def hf_pieces(name_or_path: str, who: str) -> tuple[int | None, Iterator[dict[str, torch.Tensor]]]:
    """The causal LM's embedding ``padding_idx`` and its fp32 tensors by HF name, a piece at a time -- the tensors
    outside the decoder layers first, then layer by layer -- read from its safetensors files (fused experts stacked
    from their per-expert tensors): for an engine that converts each piece into its own layout and keeps its share
    (``core.train.megatron_model``), so a rank never holds the whole model. Without safetensors files (or with
    names the meta model does not know): the whole model, loaded, as one piece."""
    from core.models import load_causal_lm, resolve_model

    files = _safetensors_files(resolve_model(name_or_path))
    model, where, _ = _meta_model(files, who) if files else (None, None, {})
    if model is None:
        whole = load_causal_lm(name_or_path, dtype=torch.float32)
        return whole.get_input_embeddings().padding_idx, iter([dict(whole.state_dict())])
    groups: dict[int, list[str]] = {}
    for name in where:
        groups.setdefault(int(name.split(".")[2]) if name.startswith("model.layers.") else -1, []).append(name)

    def read(name: str) -> torch.Tensor:
        parts, stored = where[name]
        if isinstance(parts, str):
            return stored[parts].get_tensor(parts).float()
        return torch.stack([torch.cat([stored[n].get_tensor(n) for n in expert]) for expert in parts]).float()

    return model.get_input_embeddings().padding_idx, ({n: read(n) for n in groups[k]} for k in sorted(groups))


def _meta_model(files: list, who: str, value_head: bool = False, lora=None) -> tuple:
    """The model on the meta device (buffers on the host), where each of its tensors is in ``files``, and the
    host tensors of the parameters a value head adds; (None, None, {}) when the checkpoint names tensors otherwise
    (older formats transformers renames while loading)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForTokenClassification

    from core.train.moe import checkpoint_parts
    from core.models import lm_class

    config = AutoConfig.from_pretrained(files[0].parent, **({"num_labels": 1} if value_head else {}))
    fresh = {}
    if value_head:
        config.classifier_dropout = 0.0  # as load_value_model: the generic head would drop 10% of the state
        fresh = {"score.weight": torch.empty(1, config.hidden_size).normal_(0.0, config.initializer_range),
                 "score.bias": torch.zeros(1)}
    with init_empty_weights(include_buffers=False):
        build = AutoModelForTokenClassification if value_head else lm_class(config)
        model = build.from_config(config, dtype=torch.float32)
    model.tie_weights()  # on meta, from_config leaves tied embeddings as two parameters
    from core.train.lora import fresh_adapters, hf_name, inject

    if lora is not None and lora.rank:  # low-rank adapters: drawn on the host, the base weights under their HF names
        fresh |= fresh_adapters(inject(model, lora))
    stored = _tensor_files(files)
    params = dict(model.named_parameters())
    fresh = {k: v for k, v in fresh.items() if k in params}
    # each parameter's tensors in the files (MoE experts stored one by one, transformers fuses them: core.train.moe)
    where = {k: (parts, stored) for k, p in params.items() if k not in fresh
             and (parts := checkpoint_parts(hf_name(k), p.shape[0], stored)) is not None}
    missing = sorted(set(params) - set(where) - set(fresh))
    if missing:
        print(f"{who}: {len(missing)} parameter(s) (e.g. {missing[0]}) are not under their names in "
              f"{files[0].parent}; loading the full model instead of shard by shard", flush=True)
        return None, None, {}
    return model, where, fresh


def _safetensors_files(path: str) -> list:
    from pathlib import Path

    folder = Path(path)
    if not folder.is_dir():
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(path, allow_patterns=["*.json", "*.safetensors"]))
        except Exception:  # offline or no such repo: the full load reports it
            return []
    return sorted(folder.glob("*.safetensors"))


def _tensor_files(files: list) -> dict:
    """Tensor name -> the open (memory-mapped) safetensors file that holds it."""
    from safetensors import safe_open

    where = {}
    for f in files:
        handle = safe_open(str(f), framework="pt")
        where.update((key, handle) for key in handle.keys())
    return where


@torch.no_grad()
def _fill_shards(model: torch.nn.Module, where: dict, fresh: dict | None = None) -> None:
    """Copy each parameter's rows of this rank (FSDP2 shards dim 0 as ``torch.chunk`` does) from the files, or
    from ``fresh`` (host tensors of parameters the checkpoint lacks). named_parameters() lists a tied weight once,
    under its first name (the embeddings)."""
    fresh = fresh or {}
    for name, param in model.named_parameters():
        local = param.to_local() if hasattr(param, "to_local") else param
        rows = param.shape[0]
        start = (param.device_mesh.get_local_rank() * -(-rows // param.device_mesh.size())
                 if hasattr(param, "device_mesh") else 0)
        if not local.shape[0]:
            continue
        stop = start + local.shape[0]
        if name in fresh:
            local.copy_(fresh[name][start:stop])
            continue
        parts, stored = where[name]
        if isinstance(parts, str):
            local.copy_(stored[parts].get_slice(parts)[start:stop])
        else:  # fused experts: read only this rank's experts
            local.copy_(torch.stack([torch.cat([stored[n].get_tensor(n) for n in parts[e]])
                                     for e in range(start, stop)]))


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Recompute activations in backward (transformers 5 renamed the method; older versions have the first)."""
    getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()


def adamw_with_warmup(model: torch.nn.Module, o) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the (sharded) trainable parameters (a LoRA model's adapters only); the LR rises linearly to
    ``o.lr`` over ``o.warmup_steps`` steps."""
    params = [p for p in model.parameters() if p.requires_grad]
    # one fused kernel over all parameters (torch's default on CPU is a Python loop of ~12 ops per parameter)
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    optim = torch.optim.AdamW(params, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, fused=fused)
    warm = max(1, o.warmup_steps)
    return optim, torch.optim.lr_scheduler.LambdaLR(optim, lambda s: min(1.0, (s + 1) / warm))


def clipped_step(model: torch.nn.Module, optim, sched, clip: float) -> float:
    """Clip the global gradient norm (0 = no clip) and step, zero the grads; returns the norm. An inf/nan norm
    skips the step, the LR schedule included (it counts updates that happened); the caller counts the skips."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf)
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    if math.isfinite(norm):
        optim.step()
        weights_changed(model)
        sched.step()
    optim.zero_grad(set_to_none=True)
    return norm


class FSDPEngine:
    """What the FSDP2 roles (``FSDPActor``, ``FSDPCritic``) share as engine hooks: they hold ``model``, ``optim``,
    ``sched``, ``idle`` (``IdleOffload``), ``ctx`` and ``cfg.optim``."""

    def _step(self) -> float:
        return clipped_step(self.model, self.optim, self.sched, self.cfg.optim.grad_clip)

    def _resident(self, optim: bool = False):
        return self.idle.on_gpu(optim=optim)

    def save_checkpoint(self, path: str) -> None:
        """Collective: model, optimizer, scheduler and RNG states under ``path`` (``save_state``)."""
        with self.idle.on_gpu(optim=True):
            save_state(path, self.model, self.optim, self.sched, self.ctx.rank)

    def load_checkpoint(self, path: str) -> None:
        """Collective: the state ``save_checkpoint`` wrote."""
        with self.idle.on_gpu(optim=True):
            load_state(path, self.model, self.optim, self.sched, self.ctx.rank)


def save_state(path: str, model, optim, sched, rank: int) -> None:
    """Collective: model and optimizer as torch.distributed.checkpoint shards of every rank under ``path``; the LR
    scheduler (rank 0) and this rank's RNG states beside them (``core.checkpoint``)."""
    import torch.distributed.checkpoint as dcp

    from core.checkpoint import rng_state

    dcp.save(_dcp_state(model, optim), checkpoint_id=path)
    if sched is not None and rank == 0:
        torch.save(sched.state_dict(), f"{path}/scheduler.pt")
    torch.save(rng_state(), f"{path}/rng_rank{rank}.pt")


def load_state(path: str, model, optim, sched, rank: int) -> None:
    """Collective: what ``save_state`` wrote (DCP reshards if the world size changed; the RNG states then cannot
    follow their ranks, which is an error naming the rank)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    from core.checkpoint import set_rng_state

    rng = f"{path}/rng_rank{rank}.pt"
    if not os.path.isfile(rng):
        raise FileNotFoundError(f"rank {rank}: {rng} missing -- the checkpoint was written by fewer ranks")
    state = _dcp_state(model, optim)
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optim or [], model_state_dict=state["model"], optim_state_dict=state.get("optim", {}))
    weights_changed(model)
    if sched is not None:
        sched.load_state_dict(torch.load(f"{path}/scheduler.pt", weights_only=False))
    set_rng_state(torch.load(rng, weights_only=False))


def _dcp_state(model, optim) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    m, o = get_state_dict(model, optim or [])
    return {"model": m} | ({"optim": o} if optim is not None else {})
