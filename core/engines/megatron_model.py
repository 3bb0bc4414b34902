"""What the Megatron-core roles share (``MegatronActor``, ``MegatronCritic``): the CPU shims, the ``GPTModel`` of an
HF config, and ``MegatronModel`` -- the model built, its HF checkpoint converted and cut to this rank's TP shard
(``core.engines.megatron_convert``), the forward over a micro-batch's response positions, the optimizer step
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

from core.engines.forward import trim_padding
from core.engines.megatron_convert import Layout, hf_to_megatron, tp_dim, tp_shard
from core.engines.sharding import IdleOffload, adamw_with_warmup
from core.protocol import Batch
from core.worker import WorkerContext


def megatron_on_cpu() -> None:
    """Megatron-core assumes CUDA in four places on our path (megatron-core 0.16.1): its RoPE moves the frequencies
    to ``torch.cuda.current_device()`` (rotary_pos_embedding.py, ``get_emb``: pointed at "cpu"), a missing attention
    mask becomes a causal mask built on "cuda" (transformer/utils.py: we always pass ours), attention dropout
    forks the CUDA RNG tracker even at p = 0 (dot_product_attention.py: the fork yields without switching RNG
    states), and activation recomputation saves / restores the CUDA RNG state (random.py: nothing to save; no
    dropout here). Process-wide: only for a rank whose device is the CPU (where ``torch.cuda`` has nothing to give)."""
    from megatron.core.tensor_parallel import random as mrandom

    torch.cuda.current_device = lambda: "cpu"
    mrandom.CudaRNGStatesTracker.fork = contextlib.contextmanager(lambda self, name="model-parallel-rng": (yield))
    # activation recomputation saves and restores the CUDA RNG state around each recomputed layer: none on a CPU
    mrandom._get_cuda_rng_state = lambda *args, **kwargs: None
    mrandom._set_cuda_rng_state = lambda *args, **kwargs: None


def quiet_cpu_notes() -> None:
    """Megatron-core's notes that do not apply to a CPU rank: Transformer Engine / Apex (GPU-only packages) absent,
    CUDA_DEVICE_MAX_CONNECTIONS, and torch's deprecation of the all-gather it calls."""
    import warnings

    for note in ("Transformer Engine and Apex are not installed", "Apex is not installed", "full scope is deprecated",
                 "When using async grad allreduce", "`torch.distributed.all_gather_into_tensor` is deprecated"):
        warnings.filterwarnings("ignore", message=note)


def gpt_model(hf_config, tp: int, params_dtype: torch.dtype = torch.float32, recompute: bool = False,
              tied: bool | None = None):
    """Megatron-core's GPTModel (local layer spec) of a Llama / Qwen2-family HF config; ``recompute``: every layer's
    activations recomputed in backward (Megatron's full, uniform, one layer per unit: only its input is kept);
    ``tied``: share the embedding with the output layer (default: as the config)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    c, L = hf_config, Layout.from_hf_config(hf_config)
    rope = getattr(c, "rope_parameters", None) or {"rope_theta": getattr(c, "rope_theta", 10000.0)}
    cfg = TransformerConfig(num_layers=c.num_hidden_layers, hidden_size=c.hidden_size,
                            num_attention_heads=c.num_attention_heads, num_query_groups=L.kv_heads,
                            kv_channels=L.head_dim, ffn_hidden_size=c.intermediate_size, gated_linear_unit=True,
                            activation_func=F.silu, normalization="RMSNorm", layernorm_epsilon=c.rms_norm_eps,
                            add_bias_linear=False, add_qkv_bias=c.model_type == "qwen2",
                            tensor_model_parallel_size=tp, use_cpu_initialization=True, params_dtype=params_dtype,
                            bias_dropout_fusion=False, apply_rope_fusion=False, masked_softmax_fusion=False,
                            gradient_accumulation_fusion=False, hidden_dropout=0.0, attention_dropout=0.0,
                            **({"recompute_granularity": "full", "recompute_method": "uniform",
                                "recompute_num_layers": 1} if recompute else {}))
    return GPTModel(cfg, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=L.padded_vocab(tp),
                    max_sequence_length=c.max_position_embeddings, share_embeddings_and_output_weights=L.tied if tied is None else tied,
                    parallel_output=True, position_embedding_type="rope", rotary_base=int(rope["rope_theta"]))


def no_gradient_through(token: int):
    """A forward hook on Megatron's word embedding giving HF's ``padding_idx`` semantics: the embedding row of
    ``token`` learns nothing from its lookups (tied, it still learns as an output row). HF builds Llama / Qwen2
    embeddings with ``padding_idx = pad_token_id``, often a real token (EOS); without this the Megatron actor's
    gradient differs from the FSDP actor's in that one row."""
    def hook(module, args, out):
        return torch.where((args[0] == token)[..., None], out.detach(), out)
    return hook


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
    ``core.engines.sharding`` draws the FSDP critic's (normal, std ``initializer_range``; bias 0; first thing after
    seeding), so both engines start from the same critic."""

    def __init__(self, ctx: WorkerContext, name: str, tp: int, dtype: str, seed: int, optim=None,
                 offload: str = "none", recompute: bool = False, value_head: bool = False, role: str = "actor"):
        if ctx.device.type == "cpu":
            quiet_cpu_notes()
        from megatron.core import parallel_state
        from transformers import AutoConfig

        from core.models import load_causal_lm, resolve_dtype, resolve_model

        self.ctx, self.tp = ctx, tp
        if ctx.world_size % tp:
            raise ValueError(f"{role}.megatron.tp={tp} does not divide the {role}'s {ctx.world_size} ranks")
        if ctx.device.type == "cpu":
            megatron_on_cpu()
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(tp, 1)
        elif parallel_state.get_tensor_model_parallel_world_size() != tp:
            raise ValueError(f"{role}.megatron.tp={tp}, but this process's model-parallel layout is TP "
                             f"{parallel_state.get_tensor_model_parallel_world_size()} (colocated Megatron roles share one)")
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.dp_group = parallel_state.get_data_parallel_group()
        self.tp_rank, self.dp = parallel_state.get_tensor_model_parallel_rank(), ctx.world_size // tp
        self.compute_dtype = resolve_dtype(dtype, ctx.device)
        hf_config = AutoConfig.from_pretrained(resolve_model(name))
        self.layout = Layout.from_hf_config(hf_config)
        torch.manual_seed(seed)
        head = None
        if value_head:
            self.layout = Layout(**{**self.layout.__dict__, "tied": True})   # the backbone: no LM head to convert
            head = (torch.empty(1, hf_config.hidden_size).normal_(0.0, hf_config.initializer_range), torch.zeros(1))
        self.model = gpt_model(hf_config, tp, recompute=recompute, tied=self.layout.tied)
        if head is not None:
            self.model.output_layer = ValueHead(*head)
        self.model.to(ctx.device)
        # the whole HF model on every rank, then its shard (shard-by-shard reading, as core.engines.sharding's: not yet)
        hf_model = load_causal_lm(name, dtype=torch.float32)
        pad = hf_model.get_input_embeddings().padding_idx
        if pad is not None:  # transformers' nn.Embedding(padding_idx): that token's lookups get no gradient
            self.model.embedding.word_embeddings.register_forward_hook(no_gradient_through(pad))
        hf = hf_model.state_dict()
        del hf_model
        if self.layout.tied:
            hf.pop("lm_head.weight", None)
        self.hf_bytes = {n: t.numel() * t.element_size() for n, t in hf.items()}   # the sync's bucket plan
        shard = tp_shard(hf_to_megatron(hf, self.layout, tp), tp, self.tp_rank)
        del hf
        missing, unexpected = self.model.load_state_dict(shard, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state") and not k.startswith("output_layer.score_")]
        if unexpected or missing:
            raise RuntimeError(f"Megatron {role}: missing {missing[:4]}, unexpected {unexpected[:4]}")
        torch.manual_seed(seed)  # after the build: every rank draws the same shuffles
        self.optim = self.sched = None
        if optim is not None:
            self.optim, self.sched = adamw_with_warmup(self.model, optim)
        self.idle = IdleOffload(self.model, self.optim, ctx.device, offload == "idle")

    def forward(self, mb: Batch, remove_padding: bool) -> tuple[torch.Tensor, int]:
        """The model's output at the positions that predict the response tokens, (B, Tr', X) -- Tr' < Tr where the
        padding-free run trimmed response columns that are padding in every row -- and the full width Tr. The
        attention mask is causal and hides padding keys."""
        full = mb["responses"].shape[1]
        if remove_padding:
            mb = trim_padding(mb)
        ids, real, Tr = mb["input_ids"], mb["attention_mask"].bool(), mb["responses"].shape[1]
        T = ids.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
        hidden = ~(causal[None, None] & real[:, None, None, :])          # True: this query may not see this key
        autocast = (nullcontext() if self.compute_dtype == torch.float32
                    else torch.autocast(self.ctx.device.type, dtype=self.compute_dtype))
        with autocast:
            out = self.model(ids, mb["position_ids"], attention_mask=hidden)
        return out[:, T - Tr - 1:T - 1], full

    def counts(self, mask: torch.Tensor) -> tuple[float, float]:
        t = torch.tensor([float(mask.sum()), float(mask.shape[0])], device=self.ctx.device)
        dist.all_reduce(t, group=self.dp_group)
        return float(t[0]), float(t[1])

    def step(self, clip: float) -> float:
        """Average gradients over DP, clip by the global norm (TP shards summed over the TP group, replicated weights
        once), AdamW; returns the norm. An inf/nan norm skips the step."""
        params = [(n, p) for n, p in self.model.named_parameters() if p.grad is not None]
        if self.dp > 1:
            for _, p in params:
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=self.dp_group)
        split = sum((p.grad.float().pow(2).sum() for n, p in params if tp_dim(n) is not None), torch.zeros(()))
        if self.tp > 1:
            dist.all_reduce(split, group=self.tp_group)
        replicated = sum((p.grad.float().pow(2).sum() for n, p in params if tp_dim(n) is None), torch.zeros(()))
        norm = float((split + replicated).sqrt())
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
