"""What the Megatron-core roles share (``MegatronActor``, ``MegatronCritic``): the CPU shims, the ``GPTModel`` of an
HF config, and ``MegatronModel`` -- the model built, its HF checkpoint converted and cut to this rank's TP shard
(``core.train.megatron_convert``), the forward over a micro-batch's response positions, the optimizer step
with gradients averaged over DP and the global norm over TP, DP-group counts, offload and checkpoints.

TP peers see the same rows (the role's ``mp_size`` is TP), so a mini-batch's counts are summed over the DP group
only; gradients are averaged over DP (as FSDP2's reduce-scatter), the global norm counts each TP-split weight's
shards once and replicated weights once, then AdamW (fp32 weights; bf16 compute by autocast).
"""

from __future__ import annotations

import contextlib
import math
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from core.train.forward import trim_padding
from core.train.megatron_convert import Layout, ep_shard, hf_to_megatron, is_expert, pp_stage, tp_dim, tp_shard
from core.train.sharding import IdleOffload, adamw_with_warmup, hf_pieces
from core.protocol import Batch
from core.worker import WorkerContext


def megatron_on_cpu() -> None:
    """Megatron-core assumes CUDA in six places on our path (megatron-core 0.16.1): its RoPE moves the frequencies
    to ``torch.cuda.current_device()`` (rotary_pos_embedding.py, ``get_emb``: pointed at "cpu"), a missing attention
    mask becomes a causal mask built on "cuda" (transformer/utils.py: we always pass ours), attention dropout
    forks the CUDA RNG tracker even at p = 0 (dot_product_attention.py: the fork yields without switching RNG
    states), activation recomputation saves / restores the CUDA RNG state (random.py: nothing to save; no
    dropout here), and a tied embedding's copy on the last pipeline stage is initialised by an all-reduce of a
    ``.cuda()`` tensor (language_module.py: skipped, the loader writes it), and the pipeline schedules count tokens
    in a tensor made on "cuda" (schedules.py: made on the CPU). Process-wide: only for a rank whose device is the CPU
    (where ``torch.cuda`` has nothing to give)."""
    from megatron.core.tensor_parallel import random as mrandom

    torch.cuda.current_device = lambda: "cpu"
    mrandom.CudaRNGStatesTracker.fork = contextlib.contextmanager(lambda self, name="model-parallel-rng": (yield))
    # activation recomputation saves and restores the CUDA RNG state around each recomputed layer: none on a CPU
    mrandom._get_cuda_rng_state = lambda *args, **kwargs: None
    mrandom._set_cuda_rng_state = lambda *args, **kwargs: None
    # tied embeddings over pipeline stages: the last stage's copy starts as zeros that an all-reduce on "cuda" fills;
    # skipped -- the loader writes the copy from the checkpoint (megatron_convert.pp_stage)
    from megatron.core.models.common.language_module.language_module import LanguageModule

    LanguageModule._is_in_embd_group = lambda self: False
    # the pipeline schedules count tokens in torch.zeros(..., device="cuda"): their `torch`, reading "cuda" as the CPU
    from megatron.core.pipeline_parallel import schedules

    schedules.torch = _TorchOnCpu()
    # an MoE router's linear: moe_utils names Transformer Engine's gemm even where TE is absent (a NameError)
    from megatron.core.transformer.moe import moe_utils

    moe_utils.te_general_gemm = getattr(moe_utils, "te_general_gemm", None)


class _TorchOnCpu:
    """``torch`` for megatron's pipeline schedules on a CPU rank: the same module but ``zeros`` on device "cuda"."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def zeros(*args, device=None, **kwargs):
        return torch.zeros(*args, device="cpu" if device == "cuda" else device, **kwargs)


def quiet_cpu_notes() -> None:
    """Megatron-core's notes that do not apply to a CPU rank: Transformer Engine / Apex (GPU-only packages) absent,
    CUDA_DEVICE_MAX_CONNECTIONS, and torch's deprecation of the all-gather it calls."""
    import warnings

    for note in ("Transformer Engine and Apex are not installed", "Apex is not installed", "full scope is deprecated",
                 "When using async grad allreduce", "`torch.distributed.all_gather_into_tensor` is deprecated"):
        warnings.filterwarnings("ignore", message=note)


def gpt_model(hf_config, tp: int, params_dtype: torch.dtype = torch.float32, recompute: bool = False,
              tied: bool | None = None, pp: int = 1, first: bool = True, last: bool = True, ep: int = 1):
    """Megatron-core's GPTModel (local layer spec) of a Llama / Qwen2-family HF config; ``recompute``: every layer's
    activations recomputed in backward (Megatron's full, uniform, one layer per unit: only its input is kept);
    ``tied``: share the embedding with the output layer (default: as the config); ``pp`` stages, this rank's being
    the ``first`` (it embeds) and / or the ``last`` (final norm and output layer). Fixed shapes between stages, no
    batched p2p (its CUDA synchronise), losses not divided by the schedule (ours are normalised already). A
    mixture of experts gets MoE layers over ``ep`` expert-parallel ranks: Mixtral's routing (top-k of the logits,
    softmax over those k: its softmax-top-k-renormalise) or Qwen2-MoE's (softmax, then the top k) with its gated
    shared expert, the router in fp32 as HF's, no load-balancing loss, dropless; the all-gather token dispatcher
    (the all-to-all one needs CUDA streams)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    c, L = hf_config, Layout.from_hf_config(hf_config)
    rope = getattr(c, "rope_parameters", None) or {"rope_theta": getattr(c, "rope_theta", 10000.0)}
    pipeline = {"pipeline_model_parallel_size": pp, "pipeline_dtype": params_dtype, "batch_p2p_comm": False,
                "calculate_per_token_loss": True} if pp > 1 else {}
    moe = {"num_moe_experts": L.experts, "moe_router_topk": c.num_experts_per_tok, "moe_ffn_hidden_size":
           getattr(c, "moe_intermediate_size", None) or c.intermediate_size, "moe_token_dispatcher_type": "allgather",
           "expert_model_parallel_size": ep, "moe_router_load_balancing_type": "none", "moe_aux_loss_coeff": 0.0,
           "moe_grouped_gemm": False, "moe_router_dtype": "fp32",
           # Qwen2-MoE without norm_topk_prob: softmax over all experts, then the top k as they are
           "moe_router_pre_softmax": not getattr(c, "norm_topk_prob", True)} if L.experts else {}
    if L.shared_expert:
        moe |= {"moe_shared_expert_intermediate_size": c.shared_expert_intermediate_size, "moe_shared_expert_gate": True}
    cfg = TransformerConfig(num_layers=c.num_hidden_layers, hidden_size=c.hidden_size,
                            num_attention_heads=c.num_attention_heads, num_query_groups=L.kv_heads,
                            kv_channels=L.head_dim, ffn_hidden_size=c.intermediate_size, gated_linear_unit=True,
                            activation_func=F.silu, normalization="RMSNorm", layernorm_epsilon=c.rms_norm_eps,
                            add_bias_linear=False, add_qkv_bias=c.model_type in ("qwen2", "qwen2_moe"),
                            tensor_model_parallel_size=tp, use_cpu_initialization=True, params_dtype=params_dtype,
                            bias_dropout_fusion=False, apply_rope_fusion=False, masked_softmax_fusion=False,
                            gradient_accumulation_fusion=False, hidden_dropout=0.0, attention_dropout=0.0,
                            **pipeline, **moe, **({"recompute_granularity": "full", "recompute_method": "uniform",
                                                   "recompute_num_layers": 1} if recompute else {}))
    spec = get_gpt_layer_local_spec(num_experts=L.experts or None, moe_grouped_gemm=False, normalization="RMSNorm")
    return GPTModel(cfg, spec, vocab_size=L.padded_vocab(tp),
                    max_sequence_length=c.max_position_embeddings,
                    share_embeddings_and_output_weights=L.tied if tied is None else tied, pre_process=first,
                    post_process=last, parallel_output=True, position_embedding_type="rope",
                    rotary_base=int(rope["rope_theta"]))


def no_gradient_through(token: int):
    """A forward hook on Megatron's word embedding giving HF's ``padding_idx`` semantics: the embedding row of
    ``token`` learns nothing from its lookups (tied, it still learns as an output row). HF builds Llama / Qwen2
    embeddings with ``padding_idx = pad_token_id``, often a real token (EOS); without this the Megatron actor's
    gradient differs from the FSDP actor's in that one row."""
    def hook(module, args, out):
        return torch.where((args[0] == token)[..., None], out.detach(), out)
    return hook


def response_span(out: torch.Tensor, mb: Batch) -> torch.Tensor:
    """A model output (B, T, X) at the positions T - Tr - 1 .. T - 2, which predict the Tr response tokens."""
    T, Tr = mb["input_ids"].shape[1], mb["responses"].shape[1]
    return out[:, T - Tr - 1:T - 1]


class ValueHead(torch.nn.Module):
    """Stands in for GPTModel's output layer in a value model: V = w . h + b per position, (s, b, 1), replicated on
    every TP rank (the hidden states are whole on each). Parameter names avoid ``output_layer.weight``, which
    ``tp_dim`` reads as split over TP."""

    sequence_parallel = False

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor):
        super().__init__()
        self.score_weight, self.score_bias = torch.nn.Parameter(weight), torch.nn.Parameter(bias)

    def forward(self, hidden, weight=None, runtime_gather_output=None):
        return F.linear(hidden, self.score_weight, self.score_bias), None


class MegatronModel:
    """One rank's share of a Megatron-core model of an HF checkpoint, and what a role does with it.

    ``value_head``: the critic's value model -- the backbone without an LM head and a ``ValueHead`` drawn as
    ``core.train.sharding`` draws the FSDP critic's (normal, std ``initializer_range``; bias 0; first thing after
    seeding), so both engines start from the same critic."""

    def __init__(self, ctx: WorkerContext, name: str, tp: int, dtype: str, seed: int, optim=None,
                 offload: str = "none", recompute: bool = False, value_head: bool = False, role: str = "actor",
                 pp: int = 1, ep: int = 1):
        if ctx.device.type == "cpu":
            quiet_cpu_notes()
        from megatron.core import parallel_state
        from transformers import AutoConfig

        from core.models import resolve_dtype, resolve_model

        self.ctx, self.tp, self.pp, self.ep = ctx, tp, pp, ep
        if ctx.world_size % (tp * pp):
            raise ValueError(f"{role}.megatron tp={tp} x pp={pp} does not divide the {role}'s {ctx.world_size} ranks")
        if ctx.device.type == "cpu":
            megatron_on_cpu()
        ps = parallel_state
        if not ps.model_parallel_is_initialized():
            # a model replica's ranks consecutive (TP fastest, then PP, DP slowest): the worker group gives each
            # run of tp x pp consecutive ranks the same rows
            ps.initialize_model_parallel(tp, pp, expert_model_parallel_size=ep, order="tp-cp-ep-pp-dp")
        elif (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size()) != (tp, pp):
            raise ValueError(f"{role}.megatron tp={tp} x pp={pp}, but this process's model-parallel layout is TP "
                             f"{ps.get_tensor_model_parallel_world_size()} x PP "
                             f"{ps.get_pipeline_model_parallel_world_size()} (colocated Megatron roles share one)")
        self.tp_group, self.dp_group = ps.get_tensor_model_parallel_group(), ps.get_data_parallel_group()
        self.pp_group = ps.get_pipeline_model_parallel_group()
        self.tp_rank, self.dp = ps.get_tensor_model_parallel_rank(), ctx.world_size // (tp * pp)
        self.stage, self.first, self.last = (ps.get_pipeline_model_parallel_rank(), ps.is_pipeline_first_stage(),
                                             ps.is_pipeline_last_stage())
        self.embedding_group = ps.get_embedding_group() if pp > 1 and ps.is_rank_in_embedding_group() else None
        # experts: ep ranks each hold E / ep of them; their gradients are averaged over the expert-data-parallel group
        self.ep_group, self.ep_rank = ps.get_expert_model_parallel_group(), ps.get_expert_model_parallel_rank()
        self.edp_group = ps.get_expert_data_parallel_group()
        self.compute_dtype = resolve_dtype(dtype, ctx.device)
        hf_config = AutoConfig.from_pretrained(resolve_model(name))
        self.layout = Layout.from_hf_config(hf_config)
        torch.manual_seed(seed)
        head = None
        if value_head:
            self.layout = Layout(**{**self.layout.__dict__, "tied": True})   # the backbone: no LM head to convert
            head = (torch.empty(1, hf_config.hidden_size).normal_(0.0, hf_config.initializer_range), torch.zeros(1))
        self.model = gpt_model(hf_config, tp, recompute=recompute, tied=self.layout.tied, pp=pp, first=self.first,
                               last=self.last, ep=ep)
        if head is not None and self.last:
            self.model.output_layer = ValueHead(*head)
        self.model.to(ctx.device)
        # the HF checkpoint a layer at a time: each piece converted, this rank's share of it kept (copied out of the
        # piece, which is then dropped): a rank never holds more than one layer beyond its shard
        pad, pieces = hf_pieces(name, f"{role} rank {ctx.rank}")
        if pad is not None and self.first:  # transformers' nn.Embedding(padding_idx): its lookups get no gradient
            self.model.embedding.word_embeddings.register_forward_hook(no_gradient_through(pad))
        shard, self.hf_bytes = {}, {}   # hf_bytes: fp32 bytes by HF name, the sync's bucket plan
        for piece in pieces:
            if self.layout.tied:
                piece.pop("lm_head.weight", None)
            self.hf_bytes |= {n: t.numel() * 4 for n, t in piece.items()}
            part = hf_to_megatron(piece, self.layout, tp, partial=True)
            part = tp_shard(pp_stage(part, self.layout, pp, self.stage) if pp > 1 else part, tp, self.tp_rank)
            if self.layout.experts:
                part = ep_shard(part, ep, self.ep_rank, self.layout.experts)
            shard |= {n: t.clone() for n, t in part.items()}
            del piece, part
        missing, unexpected = self.model.load_state_dict(shard, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state") and not k.startswith("output_layer.score_")]
        if unexpected or missing:
            raise RuntimeError(f"Megatron {role}: missing {missing[:4]}, unexpected {unexpected[:4]}")
        torch.manual_seed(seed)  # after the build: every rank draws the same shuffles
        self.optim = self.sched = None
        if optim is not None:
            self.optim, self.sched = adamw_with_warmup(self.model, optim)
        self.idle = IdleOffload(self.model, self.optim, ctx.device, offload == "idle")

    def _autocast(self):
        if self.compute_dtype == torch.float32:
            return nullcontext()
        return torch.autocast(self.ctx.device.type, dtype=self.compute_dtype)

    @staticmethod
    def _run(model, mb: Batch) -> torch.Tensor:
        """The model on a micro-batch: a causal attention mask that also hides padding keys."""
        ids, real = mb["input_ids"], mb["attention_mask"].bool()
        T = ids.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
        hidden = ~(causal[None, None] & real[:, None, None, :])          # True: this query may not see this key
        return model(ids, mb["position_ids"], attention_mask=hidden)

    def forward(self, mb: Batch, remove_padding: bool) -> tuple[torch.Tensor, int]:
        """(One stage.) The model's output at the positions that predict the response tokens, (B, Tr', X) -- Tr' < Tr
        where the padding-free run trimmed response columns that are padding in every row -- and the full width."""
        full = mb["responses"].shape[1]
        if remove_padding:
            mb = trim_padding(mb)
        with self._autocast():
            out = self._run(self.model, mb)
        return response_span(out, mb), full

    def schedule(self, micros: list[Batch], last_stage, forward_only: bool) -> list[dict]:
        """(Pipeline stages.) ``micros`` -- equal shapes -- through Megatron's 1F1B schedule: the first stage embeds,
        each stage runs its layers and passes activations on; on the last stage ``last_stage(mb, out)`` (out: its
        output at the response positions) returns (loss, extras dict); backward unless ``forward_only``. Returns
        the extras of each micro-batch on the last stage, [] elsewhere."""
        from functools import partial

        from megatron.core.pipeline_parallel import get_forward_backward_func

        def finish(mb, out):
            loss, extras = last_stage(mb, response_span(out, mb))
            return loss, torch.ones((), dtype=torch.int), extras

        def step(data, model):
            mb = next(data)
            return self._run(model, mb), partial(finish, mb)

        B, T = micros[0]["input_ids"].shape
        with self._autocast():
            return get_forward_backward_func()(forward_step_func=step, data_iterator=iter(micros), model=[self.model],
                                               num_microbatches=len(micros), seq_length=T, micro_batch_size=B,
                                               forward_only=forward_only)

    def from_last(self, obj):
        """(Pipeline stages.) The last stage's ``obj`` on every stage of this replica."""
        if self.pp == 1:
            return obj
        box = [obj if self.last else None]
        dist.broadcast_object_list(box, src=dist.get_process_group_ranks(self.pp_group)[-1], group=self.pp_group)
        return box[0]

    def counts(self, mask: torch.Tensor) -> tuple[float, float]:
        t = torch.tensor([float(mask.sum()), float(mask.shape[0])], device=self.ctx.device)
        dist.all_reduce(t, group=self.dp_group)
        return float(t[0]), float(t[1])

    def step(self, clip: float) -> float:
        """Average gradients over DP, clip by the global norm (TP shards summed over the TP group, replicated weights
        once), AdamW; returns the norm. An inf/nan norm skips the step."""
        params = [(n, p) for n, p in self.model.named_parameters() if p.grad is not None]
        edp = dist.get_world_size(self.edp_group)
        for n, p in params:
            if is_expert(n):  # an expert learns from the tokens of all dp ranks at once: their sum, not their mean
                p.grad.mul_(edp / self.dp)
                if edp > 1:
                    dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=self.edp_group)
            elif self.dp > 1:
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=self.dp_group)
        copy = None  # tied embeddings over stages: the last stage's copy learns what the first stage's does
        if self.embedding_group is not None and self.layout.tied:
            shared = self.model.shared_embedding_or_output_weight()
            dist.all_reduce(shared.grad, group=self.embedding_group)
            copy = shared if self.last and not self.first else None
        experts = sum((p.grad.float().pow(2).sum() for n, p in params if is_expert(n)), torch.zeros(()))
        if self.ep > 1:
            dist.all_reduce(experts, group=self.ep_group)
        split = sum((p.grad.float().pow(2).sum() for n, p in params
                     if tp_dim(n) is not None and p is not copy and not is_expert(n)), torch.zeros(()))
        if self.tp > 1:
            dist.all_reduce(split, group=self.tp_group)
        replicated = sum((p.grad.float().pow(2).sum() for n, p in params if tp_dim(n) is None), torch.zeros(()))
        total = split + replicated + experts
        if self.pp > 1:  # each stage its own layers
            dist.all_reduce(total, group=self.pp_group)
        norm = float(total.sqrt())
        if math.isfinite(norm):
            if clip > 0 and norm > clip:
                for _, p in params:
                    p.grad.mul_(clip / (norm + 1e-6))
            self.optim.step()
            self.sched.step()
        self.optim.zero_grad(set_to_none=True)
        return norm

    def save(self, path: str) -> None:
        """Collective: this rank's shard, optimizer and scheduler (one file per rank) and its RNG states."""
        from core.checkpoint import rng_state

        Path(path).mkdir(parents=True, exist_ok=True)
        # the state where it lives (host tensors with offload idle); load maps it back
        torch.save({"model": self.model.state_dict(), "optim": self.optim.state_dict() if self.optim else None,
                    "sched": self.sched.state_dict() if self.sched else None},
                   Path(path) / f"megatron_rank{self.ctx.rank}.pt")
        torch.save(rng_state(), Path(path) / f"rng_rank{self.ctx.rank}.pt")  # last: the commit looks for it
        dist.barrier()

    def load(self, path: str) -> None:
        from core.checkpoint import set_rng_state

        file = Path(path) / f"megatron_rank{self.ctx.rank}.pt"
        if not file.is_file():
            raise FileNotFoundError(f"rank {self.ctx.rank}: {file} missing -- the checkpoint was written by fewer "
                                    "ranks or by another strategy")
        state = torch.load(file, map_location="cpu", weights_only=False)
        with self.idle.on_gpu(optim=True):
            self.model.load_state_dict(state["model"])
            if self.optim is not None:
                self.optim.load_state_dict(state["optim"])  # cast to the parameters' device by torch
                self.sched.load_state_dict(state["sched"])
        set_rng_state(torch.load(Path(path) / f"rng_rank{self.ctx.rank}.pt", weights_only=False))


class MegatronEngine:
    """What the Megatron roles (``MegatronActor``, ``MegatronCritic``) share as engine hooks, through their ``mg``
    (``MegatronModel``) and ``cfg.optim``."""

    def _step(self) -> float:
        return self.mg.step(self.cfg.optim.grad_clip)

    def _resident(self, optim: bool = False):
        return self.mg.idle.on_gpu(optim=optim)

    def _counts(self, mask: torch.Tensor) -> tuple[float, float]:
        return self.mg.counts(mask)

    def save_checkpoint(self, path: str) -> None:
        """Collective: each rank's shard, optimizer, scheduler and RNG states under ``path``."""
        self.mg.save(path)

    def load_checkpoint(self, path: str) -> None:
        self.mg.load(path)
