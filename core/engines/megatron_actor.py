"""The actor (or the frozen reference) on Megatron-core, ``actor.strategy: megatron``: a ``GPTModel`` with tensor
parallelism over ``actor.megatron.tp`` ranks (data parallel over the rest), behind the policy role's methods
(``core.engines.policy.PolicyWorker``: the log-prob pass and the PPO update with its loss contract are shared with
the FSDP actor; this file holds the model, the forward, the optimizer step, weight export and checkpoints).

- Weights: the HF checkpoint converted and cut by ``core.engines.megatron_convert`` (each rank keeps its TP shard).
- Log-probs: vocab-parallel (``vocab_parallel_logprobs``): each TP rank normalises its slice of the vocabulary's
  logits and the max, the sum of exponentials and the target's logit are all-reduced over TP -- no rank holds a
  whole (tokens x vocabulary) tensor; the vocabulary's padding columns are masked. The attention mask is causal and
  hides padding keys.
- Loss normalisation: TP peers see the same rows (the role's ``mp_size`` is TP), so the mini-batch's counts are
  summed over the DP group only; gradients are averaged over DP (as FSDP2's reduce-scatter), the global norm counts
  each TP-split weight's shards once and replicated weights once, then AdamW (fp32 weights; bf16 compute by autocast).
- Weight sync: buckets of HF names, each gathered over TP from the whole layers it touches (``weight_buckets``
  colocated, ``gather_bucket`` for a rollout on another pool).
- On a CPU rank, ``megatron_on_cpu`` points Megatron-core's three CUDA assumptions on this path at the CPU.
- ``offload: idle``: weights and AdamW moments in host memory between calls (``sharding.IdleOffload``, as FSDP's).
- Not yet (refused before Ray by ``run_problem``; ``--dry-run`` plans them): pipeline and expert parallelism, MoE
  models, image prompts, ``offload: full``, the critic on Megatron; shard-by-shard loading (every rank reads the
  whole HF checkpoint once) is not written either.
"""

from __future__ import annotations

import contextlib
import math
from contextlib import nullcontext
from typing import Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F

from core.config import ActorConfig
from core.engines.forward import trim_padding
from core.engines.megatron_convert import Layout, hf_to_megatron, megatron_to_hf, tp_dim, tp_merge, tp_shard
from core.engines.moe import RouterStats
from core.engines.policy import PolicyWorker
from core.engines.sharding import IdleOffload, adamw_with_warmup
from core.protocol import Batch
from core.worker import WorkerContext

FAMILIES = ("llama", "qwen2")  # model_type values the converter knows


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


def run_problem(actor: ActorConfig, model_type: str, heads: int, images: bool) -> str | None:
    """Why this version cannot run ``actor`` on Megatron (None: it can), checked before Ray."""
    import importlib.util

    m = actor.megatron
    if importlib.util.find_spec("megatron.core") is None:
        return "actor.strategy=megatron needs megatron-core: pip install -e '.[megatron]'"
    if m.pp > 1 or m.ep > 1:
        return (f"actor.megatron.pp={m.pp}, ep={m.ep}: pipeline and expert parallelism are planned by --dry-run but "
                "not run by this version's Megatron actor; use pp: 1, ep: 1 (tensor parallelism runs)")
    if model_type not in FAMILIES:
        return f"actor.strategy=megatron converts {' and '.join(FAMILIES)} models; {actor.model} is {model_type!r}"
    if heads % m.tp:
        return f"actor.megatron.tp={m.tp} does not divide {actor.model}'s {heads} attention heads"
    if images:
        return "actor.strategy=megatron has no vision tower path; image prompts need actor.strategy=fsdp"
    if actor.offload == "full":
        return "actor.offload=full is FSDP2's CPUOffloadPolicy; the Megatron actor offers none or idle"
    return None


def gpt_model(hf_config, tp: int, params_dtype: torch.dtype = torch.float32, recompute: bool = False):
    """Megatron-core's GPTModel (local layer spec) of a Llama / Qwen2-family HF config; ``recompute``: every layer's
    activations recomputed in backward (Megatron's full, uniform, one layer per unit: only its input is kept)."""
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
                    max_sequence_length=c.max_position_embeddings, share_embeddings_and_output_weights=L.tied,
                    parallel_output=True, position_embedding_type="rope", rotary_base=int(rope["rope_theta"]))


def quiet_cpu_notes() -> None:
    """Megatron-core's notes that do not apply to a CPU rank: Transformer Engine / Apex (GPU-only packages) absent,
    CUDA_DEVICE_MAX_CONNECTIONS, and torch's deprecation of the all-gather it calls."""
    import warnings

    for note in ("Transformer Engine and Apex are not installed", "Apex is not installed", "full scope is deprecated",
                 "When using async grad allreduce", "`torch.distributed.all_gather_into_tensor` is deprecated"):
        warnings.filterwarnings("ignore", message=note)


def vocab_parallel_logprobs(local: torch.Tensor, ids: torch.Tensor, start: int, vocab: int, temperature: float,
                            with_entropy: bool, group) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(logits / temperature)[ids] and the entropy, (B, Tr), from this TP rank's vocabulary slice
    ``local`` (B, Tr, Vl) of columns [start, start + Vl) -- differentiable all-reduces of three (B, Tr) tensors over
    ``group`` instead of a gathered (B, Tr, V) one. Columns >= ``vocab`` (Megatron's padding) are masked. Example,
    2 ranks, vocabulary 3 padded to 4, logits (1, 2 | 3, pad), id 2: max 3, sum exp = e^-2 + e^-1 + 1, log p =
    3 - 3 - log(1.503) = -0.408, as log_softmax([1, 2, 3])[2]."""
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    def all_reduce(t, group):  # forward: the sum over TP; backward: the identity (every rank's loss is the same)
        return reduce_from_tensor_model_parallel_region(t.contiguous(), group)

    x = local.float() / temperature
    cols = torch.arange(start, start + x.shape[-1], device=x.device)
    x = x.masked_fill(cols >= vocab, -1e30)                            # exp() of it is 0, and 0 x it is 0
    top = x.detach().amax(-1)
    dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)            # a constant shift: no gradient needed
    e = (x - top[..., None]).exp()
    z = all_reduce(e.sum(-1), group=group)
    mine = (ids >= start) & (ids < start + x.shape[-1])
    target = x.gather(-1, (ids - start).clamp(0, x.shape[-1] - 1)[..., None]).squeeze(-1) * mine
    logp = all_reduce(target, group=group) - top - z.log()
    if not with_entropy:
        return logp, None
    expected = all_reduce((e * x).sum(-1), group=group) / z            # E_p[x]
    return logp, z.log() + top - expected


def _no_gradient_through(token: int):
    """A forward hook on Megatron's word embedding giving HF's ``padding_idx`` semantics: the embedding row of
    ``token`` learns nothing from its lookups (tied, it still learns as an output row). HF builds Llama / Qwen2
    embeddings with ``padding_idx = pad_token_id``, often a real token (EOS); without this the Megatron actor's
    gradient differs from the FSDP actor's in that one row."""
    def hook(module, args, out):
        return torch.where((args[0] == token)[..., None], out.detach(), out)
    return hook


class MegatronActor(PolicyWorker):
    def __init__(self, ctx: WorkerContext, cfg: ActorConfig):
        if ctx.device.type == "cpu":
            quiet_cpu_notes()
        from megatron.core import parallel_state
        from transformers import AutoConfig

        from core.models import load_causal_lm, resolve_dtype, resolve_model

        self.ctx, self.cfg, self.tp = ctx, cfg, cfg.megatron.tp
        if ctx.world_size % self.tp:
            raise ValueError(f"actor.megatron.tp={self.tp} does not divide the actor's {ctx.world_size} ranks")
        if ctx.device.type == "cpu":
            megatron_on_cpu()
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(self.tp, 1)
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.dp_group = parallel_state.get_data_parallel_group()
        self.tp_rank, self.dp = parallel_state.get_tensor_model_parallel_rank(), ctx.world_size // self.tp
        self.compute_dtype = resolve_dtype(cfg.dtype, ctx.device)
        hf_config = AutoConfig.from_pretrained(resolve_model(cfg.model))
        self.layout = Layout.from_hf_config(hf_config)
        self.model = gpt_model(hf_config, self.tp, recompute=cfg.gradient_checkpointing).to(ctx.device)
        # the whole HF model on every rank, then its shard (shard-by-shard reading, as core.engines.sharding's: not yet)
        hf_model = load_causal_lm(cfg.model, dtype=torch.float32)
        pad = hf_model.get_input_embeddings().padding_idx
        if pad is not None:  # transformers' nn.Embedding(padding_idx): that token's lookups get no gradient
            self.model.embedding.word_embeddings.register_forward_hook(_no_gradient_through(pad))
        hf = hf_model.state_dict()
        del hf_model
        if self.layout.tied:
            hf.pop("lm_head.weight", None)
        self._hf_bytes = {n: t.numel() * t.element_size() for n, t in hf.items()}   # the sync's bucket plan
        shard = tp_shard(hf_to_megatron(hf, self.layout, self.tp), self.tp, self.tp_rank)
        del hf
        missing, unexpected = self.model.load_state_dict(shard, strict=False)
        if unexpected or [k for k in missing if not k.endswith("_extra_state")]:
            raise RuntimeError(f"Megatron actor: missing {missing[:4]}, unexpected {unexpected[:4]}")
        torch.manual_seed(cfg.seed)  # after the build: every rank draws the same shuffles
        self.optim = self.sched = None
        if cfg.trainable:
            self.optim, self.sched = adamw_with_warmup(self.model, cfg.optim)
        self.idle = IdleOffload(self.model, self.optim, ctx.device, cfg.offload == "idle")
        self._filled_old: torch.Tensor | None = None
        self.routers = RouterStats(self.model)  # dense models only here: no routers, no metrics

    # ------------------------------------------------------------------------------------ engine hooks
    def _autocast(self):
        if self.compute_dtype == torch.float32:
            return nullcontext()
        return torch.autocast(self.ctx.device.type, dtype=self.compute_dtype)

    def _forward(self, mb: Batch, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log pi(response_t | context) under logits / temperature (B, Tr), zero-padded where the padding-free run
        trimmed response columns; the entropy when asked."""
        full = mb["responses"].shape[1]
        if self.cfg.remove_padding:
            mb = trim_padding(mb)
        ids, real, Tr = mb["input_ids"], mb["attention_mask"].bool(), mb["responses"].shape[1]
        T = ids.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
        hidden = ~(causal[None, None] & real[:, None, None, :])          # True: this query may not see this key
        with self._autocast():
            local = self.model(ids, mb["position_ids"], attention_mask=hidden)   # (B, T, this rank's vocab slice)
        logp, ent = vocab_parallel_logprobs(local[:, T - Tr - 1:T - 1], mb["responses"], self.tp_rank * local.shape[-1],
                                            self.layout.vocab, self.cfg.temperature, with_entropy, self.tp_group)
        if Tr < full:
            logp = F.pad(logp, (0, full - Tr))
            ent = F.pad(ent, (0, full - Tr)) if ent is not None else None
        return logp, ent

    def _resident(self, optim: bool = False):
        return self.idle.on_gpu(optim=optim)

    def _counts(self, mask: torch.Tensor) -> tuple[float, float]:
        t = torch.tensor([float(mask.sum()), float(mask.shape[0])], device=self.ctx.device)
        dist.all_reduce(t, group=self.dp_group)
        return float(t[0]), float(t[1])

    def _step(self) -> float:
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
        clip = self.cfg.optim.grad_clip
        if math.isfinite(norm):
            if clip > 0 and norm > clip:
                for _, p in params:
                    p.grad.mul_(clip / (norm + 1e-6))
            self.optim.step()
            self.sched.step()
        self.optim.zero_grad(set_to_none=True)
        return norm

    # ------------------------------------------------------------------------------------ weight export
    def _piece(self, hf_name: str) -> int:
        """The whole part of the model an HF weight comes from: layer i, or -1 (embedding) / layers (the rest)."""
        if hf_name.startswith("model.layers."):
            return int(hf_name.split(".")[2])
        return -1 if hf_name.startswith("model.embed_tokens") else self.layout.layers

    def bucket_plan(self, bucket_bytes: int = 64 << 20) -> list[list[str]]:
        plan, bucket, size = [], [], 0
        for name in sorted(self._hf_bytes, key=self._piece):
            bucket.append(name)
            size += self._hf_bytes[name]
            if size >= bucket_bytes:
                plan.append(bucket)
                bucket, size = [], 0
        return plan + [bucket] if bucket else plan

    @torch.no_grad()
    def _gather(self, names: list[str]) -> list[tuple[str, torch.Tensor]]:
        """Collective over the TP group: the whole pieces ``names`` come from gathered and merged, in HF names."""
        pieces = {self._piece(n) for n in names}
        shards = [dict() for _ in range(self.tp)]
        for name, p in self.model.named_parameters():
            i = (int(name.split(".")[2]) if name.startswith("decoder.layers.")
                 else -1 if name.startswith("embedding.") else self.layout.layers)
            if i not in pieces:
                continue
            parts = [p.detach()] * self.tp
            if self.tp > 1 and tp_dim(name) is not None:
                parts = [torch.empty_like(p) for _ in range(self.tp)]
                dist.all_gather(parts, p.detach().contiguous(), group=self.tp_group)
            for r in range(self.tp):
                shards[r][name] = parts[r]
        hf = megatron_to_hf(tp_merge(shards), self.layout, partial=True)
        return [(n, hf[n]) for n in names]

    def weight_buckets(self, bucket_bytes: int = 64 << 20) -> Iterator[list[tuple[str, torch.Tensor]]]:
        with self.idle.on_gpu():
            for names in self.bucket_plan(bucket_bytes):
                yield self._gather(names)

    def gather_bucket(self, names: list[str], dtype: str | None = None) -> list[tuple[str, torch.Tensor]] | None:
        with self.idle.on_gpu(park=False):  # the next call parks them (as FSDP's)
            bucket = self._gather(names)
        if self.ctx.rank:
            return None
        return [(n, t.to("cpu", getattr(torch, dtype) if dtype else t.dtype)) for n, t in bucket]

    # ------------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str) -> None:
        """Each rank's shard, optimizer, scheduler and RNG states under ``path`` (one file per rank)."""
        from pathlib import Path

        from core.checkpoint import rng_state

        Path(path).mkdir(parents=True, exist_ok=True)
        # the state where it lives (host tensors with offload idle); load_checkpoint maps it back
        torch.save({"model": self.model.state_dict(), "optim": self.optim.state_dict() if self.optim else None,
                    "sched": self.sched.state_dict() if self.sched else None},
                   Path(path) / f"megatron_rank{self.ctx.rank}.pt")
        torch.save(rng_state(), Path(path) / f"rng_rank{self.ctx.rank}.pt")  # last: the commit looks for it
        dist.barrier()

    def load_checkpoint(self, path: str) -> None:
        from pathlib import Path

        from core.checkpoint import set_rng_state

        file = Path(path) / f"megatron_rank{self.ctx.rank}.pt"
        if not file.is_file():
            raise FileNotFoundError(f"rank {self.ctx.rank}: {file} missing -- the checkpoint was written by fewer "
                                    "ranks or by another actor.strategy")
        state = torch.load(file, map_location="cpu", weights_only=False)
        with self.idle.on_gpu(optim=True):
            self.model.load_state_dict(state["model"])
            if self.optim is not None:
                self.optim.load_state_dict(state["optim"])  # cast to the parameters' device by torch
                self.sched.load_state_dict(state["sched"])
        set_rng_state(torch.load(Path(path) / f"rng_rank{self.ctx.rank}.pt", weights_only=False))
