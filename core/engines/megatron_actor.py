"""The actor on Megatron-core: a ``GPTModel`` with tensor parallelism over ``tp`` ranks (data parallel over the
rest), behind the FSDP actor's role methods -- ``compute_logprobs``,
``update``, ``weight_buckets`` / ``full_state_dict`` (HF names, for the rollout engine's sync), checkpoints.

- Weights: the HF checkpoint converted and cut by ``core.engines.megatron_convert`` (each rank keeps its TP shard).
- Log-probs: the model's logits gathered over TP (``parallel_output=False``, Megatron's own differentiable gather),
  the vocabulary's padding rows dropped, then log-softmax / temperature as the FSDP actor; the attention mask is
  causal and hides padding keys.
- The loss contract is the FSDP actor's: the policy-loss registry over micro-batches, normalised by the mini-batch's
  token / sequence counts over the DP ranks (``LossNorm``); TP peers see the same rows, so counts summed over the
  world are divided by TP; gradients are averaged over DP (as FSDP2's reduce-scatter), the global norm counts each
  TP-split weight's shards once and replicated weights once, then AdamW (fp32 weights; bf16 compute by autocast).
- Not yet: the trainer's wiring (an ``actor.strategy`` key; the controller's calls name FSDPActor's methods),
  pipeline parallelism, the vocab-parallel cross-entropy (no gathered logits), expert parallelism, a split-placement
  sync (``gather_bucket``), shard-by-shard loading. Megatron-core needs CUDA: tests/engines/test_megatron_actor.py
  runs this class on CPU with the three shims named in tests/engines/test_megatron_core.py.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Iterator

import torch
import torch.distributed as dist

from core.algos import POLICY_LOSSES, LossNorm
from core.algos.kl import kl_loss
from core.config import ActorConfig
from core.engines.fsdp import micro_batches
from core.engines.megatron_convert import Layout, hf_to_megatron, megatron_to_hf, tp_dim, tp_merge, tp_shard
from core.engines.sharding import adamw_with_warmup, equalise_passes
from core.protocol import Batch
from core.worker import WorkerContext


def gpt_model(hf_config, tp: int, params_dtype: torch.dtype = torch.float32):
    """Megatron-core's GPTModel (local layer spec) of a Llama / Qwen2-family HF config."""
    import torch.nn.functional as F
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
                            gradient_accumulation_fusion=False, hidden_dropout=0.0, attention_dropout=0.0)
    return GPTModel(cfg, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=L.padded_vocab(tp),
                    max_sequence_length=c.max_position_embeddings, share_embeddings_and_output_weights=L.tied,
                    parallel_output=False, position_embedding_type="rope", rotary_base=int(rope["rope_theta"]))


class MegatronActor:
    def __init__(self, ctx: WorkerContext, cfg: ActorConfig, tp: int = 1):
        from megatron.core import parallel_state
        from transformers import AutoConfig

        from core.models import load_causal_lm, resolve_dtype, resolve_model

        self.ctx, self.cfg, self.tp = ctx, cfg, tp
        if ctx.world_size % tp:
            raise ValueError(f"TP {tp} does not divide the actor's {ctx.world_size} ranks")
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(self.tp, 1)
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.dp_group = parallel_state.get_data_parallel_group()
        self.tp_rank, self.dp = parallel_state.get_tensor_model_parallel_rank(), ctx.world_size // self.tp
        self.compute_dtype = resolve_dtype(cfg.dtype, ctx.device)
        hf_config = AutoConfig.from_pretrained(resolve_model(cfg.model))
        self.layout = Layout.from_hf_config(hf_config)
        torch.manual_seed(cfg.seed)
        self.model = gpt_model(hf_config, self.tp).to(ctx.device)
        # the whole HF model on every rank, then its shard (shard-by-shard reading, as core.engines.sharding's: not yet)
        hf = load_causal_lm(cfg.model, dtype=torch.float32).state_dict()
        if self.layout.tied:
            hf.pop("lm_head.weight", None)
        shard = tp_shard(hf_to_megatron(hf, self.layout, self.tp), self.tp, self.tp_rank)
        missing, unexpected = self.model.load_state_dict(shard, strict=False)
        if unexpected or [k for k in missing if not k.endswith("_extra_state")]:
            raise RuntimeError(f"Megatron actor: missing {missing[:4]}, unexpected {unexpected[:4]}")
        self.optim = self.sched = None
        if cfg.trainable:
            self.optim, self.sched = adamw_with_warmup(self.model, cfg.optim)

    # ------------------------------------------------------------------------------------ forward
    def _autocast(self):
        if self.compute_dtype == torch.float32:
            return nullcontext()
        return torch.autocast(self.ctx.device.type, dtype=self.compute_dtype)

    def _logprobs(self, mb: Batch) -> torch.Tensor:
        """log pi(response_t | context) under logits / temperature, (B, Tr); padding positions hold junk."""
        ids, real, Tr = mb["input_ids"], mb["attention_mask"].bool(), mb["responses"].shape[1]
        T = ids.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
        hidden = ~(causal[None, None] & real[:, None, None, :])          # True: this query may not see this key
        with self._autocast():
            logits = self.model(ids, mb["position_ids"], attention_mask=hidden)
        x = logits[:, T - Tr - 1:T - 1, :self.layout.vocab].float() / self.cfg.temperature
        return x.log_softmax(-1).gather(-1, mb["responses"][..., None]).squeeze(-1)

    @torch.no_grad()
    def compute_logprobs(self, batch: Batch, with_entropy: bool = False, leave_to_update: bool = False) -> Batch:
        """``old_logprobs`` of the responses, zero on padding (the FSDP actor's contract)."""
        if with_entropy or leave_to_update:
            raise NotImplementedError("the Megatron actor computes log-probs only (no entropy, no old-from-update)")
        self.model.eval()
        out = [self._logprobs(mb.to(self.ctx.device)) * mb["response_mask"].to(self.ctx.device)
               for mb in batch.split(self.cfg.micro_batch_size)]
        return Batch({"old_logprobs": torch.cat(out).cpu()})

    # ------------------------------------------------------------------------------------ update
    def update(self, batch: Batch) -> dict[str, float]:
        """PPO epochs over this DP rank's rows (its TP peers have the same); one optimizer step per mini-batch."""
        cfg = self.cfg
        if self.optim is None:
            raise RuntimeError("update() on a frozen policy (trainable=false)")
        if cfg.ppo_mini_batch_size % self.dp:
            raise ValueError(f"ppo_mini_batch_size {cfg.ppo_mini_batch_size} is not divisible by {self.dp} DP ranks")
        self.model.train()
        loss_fn, sums, n_mini = POLICY_LOSSES[cfg.loss.name], {}, 0
        for epoch in range(cfg.ppo_epochs):
            for mini in batch.minibatches(cfg.ppo_mini_batch_size // self.dp, seed=epoch, shuffle=epoch > 0):
                counts = torch.tensor([float(mini["response_mask"].sum()), float(len(mini))], device=self.ctx.device)
                dist.all_reduce(counts)                                      # over the world: each row tp times
                tokens, seqs = (counts / self.tp).tolist()
                norm = LossNorm(cfg.loss_agg_mode, tokens, seqs, self.dp, float(mini["response_mask"].shape[-1]))
                for mb in equalise_passes(micro_batches(mini, cfg.micro_batch_size, cfg.max_tokens_per_micro),
                                          self.ctx.device):
                    dummy = mb is None
                    mb = (mini.index(slice(0, 1)) if dummy else mb).to(self.ctx.device)
                    logp = self._logprobs(mb)
                    pg, m = loss_fn(logp, mb, cfg.loss, norm)
                    loss = pg + (cfg.kl_loss_coef * kl_loss(logp, mb, cfg.kl_loss_type, norm)
                                 if cfg.kl_loss_coef > 0 else 0.0)
                    (loss * 0.0 if dummy else loss).backward()
                    if not dummy:
                        for k, v in ({"pg_loss": pg.item() / self.dp} | {k: v.item() for k, v in m.items()}).items():
                            sums[f"actor/{k}"] = sums.get(f"actor/{k}", 0.0) + v
                sums["actor/grad_norm"] = sums.get("actor/grad_norm", 0.0) + self._step()
                n_mini += 1
        return {k: v / n_mini for k, v in sums.items()} | {"actor/lr": self.optim.param_groups[0]["lr"]}

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
    @torch.no_grad()
    def _full_hf(self) -> dict[str, torch.Tensor]:
        """Collective over the TP group: every TP rank's shards gathered, merged, in HF names."""
        shards = [dict() for _ in range(self.tp)]
        for name, p in self.model.named_parameters():
            parts = [p.detach()] * self.tp
            if self.tp > 1 and tp_dim(name) is not None:
                parts = [torch.empty_like(p) for _ in range(self.tp)]
                dist.all_gather(parts, p.detach().contiguous(), group=self.tp_group)
            for r in range(self.tp):
                shards[r][name] = parts[r]
        return megatron_to_hf(tp_merge(shards), self.layout)

    def weight_buckets(self, bucket_bytes: int = 64 << 20) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Full parameters in HF names, in buckets of about ``bucket_bytes``. Collective over the TP group."""
        bucket, size = [], 0
        for name, t in self._full_hf().items():
            bucket.append((name, t))
            size += t.numel() * t.element_size()
            if size >= bucket_bytes:
                yield bucket
                bucket, size = [], 0
        if bucket:
            yield bucket

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return {n: t.cpu().clone() for n, t in self._full_hf().items()}

    # ------------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str) -> None:
        """Each rank's shard, optimizer and scheduler under ``path`` (one file per rank)."""
        from pathlib import Path

        Path(path).mkdir(parents=True, exist_ok=True)
        torch.save({"model": self.model.state_dict(), "optim": self.optim.state_dict() if self.optim else None,
                    "sched": self.sched.state_dict() if self.sched else None},
                   Path(path) / f"megatron_rank{self.ctx.rank}.pt")
        dist.barrier()

    def load_checkpoint(self, path: str) -> None:
        from pathlib import Path

        state = torch.load(Path(path) / f"megatron_rank{self.ctx.rank}.pt", map_location=self.ctx.device)
        self.model.load_state_dict(state["model"])
        if self.optim is not None:
            self.optim.load_state_dict(state["optim"])
            self.sched.load_state_dict(state["sched"])
