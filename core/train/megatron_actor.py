"""The actor (or the frozen reference) on Megatron-core, ``actor.strategy: megatron``: a ``GPTModel`` with tensor
parallelism over ``actor.megatron.tp`` ranks (data parallel over the rest), behind the policy role's methods
(``core.train.policy.PolicyWorker``: the log-prob pass and the PPO update with its loss contract are shared with
the FSDP actor). The model, its loading, optimizer step and checkpoints: ``core.train.megatron_model``; here the
log-probs and the weight export.

- Log-probs: vocab-parallel (``vocab_parallel_logprobs``): each TP rank normalises its slice of the vocabulary's
  logits and the max, the sum of exponentials and the target's logit are all-reduced over TP -- no rank holds a
  whole (tokens x vocabulary) tensor; the vocabulary's padding columns are masked.
- Weight sync: buckets of HF names, each gathered over TP from the whole layers it touches (``weight_buckets``
  colocated, ``gather_bucket`` for a rollout on another pool).
- ``offload: idle``: weights and AdamW moments in host memory between calls (``sharding.IdleOffload``, as FSDP's).
- Pipeline stages (``actor.megatron.pp``): Megatron's 1F1B schedule over fixed-shape micro-batches of
  ``micro_batch_size`` rows; the last stage computes log-probs and losses and sends them (and the metrics) to the
  other stages; tied embeddings stay equal over stages (their gradients summed over the embedding group).
- Experts (``actor.megatron.ep``; Mixtral, Qwen2-MoE with its shared expert): each rank holds E / ep experts;
  tokens reach them through Megatron's all-gather dispatcher, so every rank's micro-batches have one shape (rows
  filled up, no trimming); an
  expert's gradient is the sum over the data-parallel ranks' tokens (``MegatronModel.step``); the sync gathers
  every rank's experts into HF's fused layout.
- Not yet (refused before Ray by ``run_problem``): experts with TP or PP, image prompts, ``offload: full``.
"""

from __future__ import annotations

from typing import Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F

from core.config import ActorConfig
from core.train.megatron_convert import megatron_to_hf, tp_dim, tp_merge
from core.train.megatron_model import MegatronEngine, MegatronModel
from core.train.moe import RouterStats
from core.train.policy import PolicyWorker, bucket_names
from core.protocol import Batch
from core.worker import WorkerContext

FAMILIES = ("llama", "qwen2", "mixtral", "qwen2_moe")  # model_type values the converter knows
MOE = ("mixtral", "qwen2_moe")


def run_problem(role, model_type: str, heads: int, images: bool = False, name: str = "actor",
                layers: int = 0, dense_layers: bool = False) -> str | None:
    """Why this version cannot run ``role`` (an actor or critic config) on Megatron (None: it can), before Ray."""
    import importlib.util

    m = role.megatron
    if importlib.util.find_spec("megatron.core") is None:
        return f"{name}.strategy=megatron needs megatron-core: pip install -e '.[megatron]'"
    if m.ep > 1 and model_type not in MOE:
        return f"{name}.megatron.ep={m.ep}: expert parallelism needs a mixture of experts; {role.model} is dense"
    if dense_layers:
        return f"{role.model} mixes dense and MoE layers (decoder_sparse_step / mlp_only_layers): not converted"
    if model_type in MOE and (m.tp > 1 or m.pp > 1 or name == "critic"):
        return (f"{name}.strategy=megatron runs an MoE model with expert and data parallelism only (tp: 1, pp: 1; "
                "an FSDP critic)")
    if m.pp > 1 and name == "critic":
        return "critic.megatron.pp > 1: the Megatron critic runs tensor parallelism only; use pp: 1"
    if m.pp > 1 and layers % m.pp:
        return f"{name}.megatron.pp={m.pp} does not divide {role.model}'s {layers} layers"
    if (m.pp > 1 or m.ep > 1) and role.max_tokens_per_micro > 0:
        return (f"{name}.megatron pp={m.pp}, ep={m.ep} exchanges fixed-shape micro-batches between ranks: set "
                f"{name}.max_tokens_per_micro 0 (micro-batches by micro_batch_size)")
    if model_type not in FAMILIES:
        return (f"{name}.strategy=megatron converts {', '.join(FAMILIES[:-1])} and {FAMILIES[-1]} models; {role.model} "
                f"is {model_type!r}")
    if heads % m.tp:
        return f"{name}.megatron.tp={m.tp} does not divide {role.model}'s {heads} attention heads"
    if images:
        return f"{name}.strategy=megatron has no vision tower path; image prompts need strategy fsdp"
    if role.offload == "full":
        return f"{name}.offload=full is FSDP2's CPUOffloadPolicy; the Megatron roles offer none or idle"
    return None


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


class MegatronActor(MegatronEngine, PolicyWorker):
    def __init__(self, ctx: WorkerContext, cfg: ActorConfig):
        self.ctx, self.cfg, self.tp = ctx, cfg, cfg.megatron.tp
        self.mg = MegatronModel(ctx, cfg.model, self.tp, cfg.dtype, cfg.seed, cfg.optim if cfg.trainable else None,
                                cfg.offload, cfg.gradient_checkpointing, pp=cfg.megatron.pp, ep=cfg.megatron.ep)
        self.model, self.optim, self.sched, self.idle = self.mg.model, self.mg.optim, self.mg.sched, self.mg.idle
        self.layout, self.tp_group, self.tp_rank = self.mg.layout, self.mg.tp_group, self.mg.tp_rank
        self.dp = self.mg.dp
        self._hf_bytes = self.mg.hf_bytes
        self._filled_old: torch.Tensor | None = None
        self.routers = RouterStats(self.model)  # an MoE model's router loads (its local tokens)

    # ------------------------------------------------------------------------------------ engine hooks
    def _forward(self, mb: Batch, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log pi(response_t | context) under logits / temperature (B, Tr), zero-padded where the padding-free run
        trimmed response columns; the entropy when asked."""
        # experts over ranks: every rank's micro-batch of one shape (the token dispatcher gathers them): no trimming
        local, full = self.mg.forward(mb, self.cfg.remove_padding and self.mg.ep == 1)   # (B, Tr', vocab slice)
        logp, ent = self._logprobs(local, mb, with_entropy)
        Tr = local.shape[1]
        if Tr < full:
            logp = F.pad(logp, (0, full - Tr))
            ent = F.pad(ent, (0, full - Tr)) if ent is not None else None
        return logp, ent

    def _logprobs(self, local: torch.Tensor, mb: Batch, with_entropy: bool):
        return vocab_parallel_logprobs(local, mb["responses"][:, :local.shape[1]], self.tp_rank * local.shape[-1],
                                       self.layout.vocab, self.cfg.temperature, with_entropy, self.tp_group)

    # ------------------------------------------------------------------------------------ pipeline stages, experts
    def _equal(self, micros: list[Batch]) -> list[Batch]:
        """Micro-batches of micro_batch_size rows each (the pipeline sends fixed shapes; the experts' token
        dispatcher gathers equal shapes): a short one is filled with copies of its first row that have no response
        tokens (no loss, dropped from the outputs)."""
        out = []
        for mb in micros:
            short = self.cfg.micro_batch_size - len(mb)
            if short > 0:
                fill = mb.index(torch.zeros(short, dtype=torch.long))
                fill["response_mask"] = torch.zeros_like(fill["response_mask"])
                mb = Batch.concat([mb, fill])
            out.append(mb.to(self.ctx.device))
        return out

    def _forward_passes(self, micros: list[Batch], spare: Batch, with_entropy: bool):
        if self.mg.pp == 1 and self.mg.ep == 1:
            yield from super()._forward_passes(micros, spare, with_entropy)
            return
        if self.mg.pp == 1:  # experts over ranks: equal shapes on every rank (``_equal``), padding rows dropped
            passes = super()._forward_passes(self._equal(micros), self._equal([spare])[0], with_entropy)
            for mb, (lp, ent) in zip(micros, passes):
                yield lp[:len(mb)], ent[:len(mb)] if ent is not None else None
            return
        if self.cfg.max_tokens_per_micro > 0 and any(len(m) > self.cfg.micro_batch_size for m in micros):
            raise ValueError("actor.megatron.pp > 1 cuts micro-batches by micro_batch_size; set max_tokens_per_micro 0")

        def last_stage(mb, local):
            lp, ent = self._logprobs(local, mb, with_entropy)
            return torch.zeros(()), {"lp": lp.cpu(), "ent": ent.cpu() if ent is not None else None}

        outs = self.mg.from_last(self.mg.schedule(self._equal(micros), last_stage, forward_only=True) if micros else [])
        for mb, out in zip(micros, outs):
            yield out["lp"][:len(mb)], out["ent"][:len(mb)] if with_entropy else None

    def _train_passes(self, micros: list[Batch], spare: Batch, with_entropy: bool, loss_of) -> None:
        if self.mg.pp == 1 and self.mg.ep == 1:
            return super()._train_passes(micros, spare, with_entropy, loss_of)
        if self.mg.pp == 1:
            return super()._train_passes(self._equal(micros), self._equal([spare])[0], with_entropy, loss_of)

        def last_stage(mb, local):
            logp, ent = self._logprobs(local, mb, with_entropy)
            return loss_of(mb, logp, ent, False), {}

        self.mg.schedule(self._equal(micros), last_stage, forward_only=False)

    def _metrics(self, out: dict[str, float]) -> dict[str, float]:
        """The last stage computed the losses (and filled in the old log-probs left to the update)."""
        self._filled_old = self.mg.from_last(self._filled_old)
        return self.mg.from_last(out)

    # ------------------------------------------------------------------------------------ weight export
    def _piece(self, hf_name: str) -> int:
        """The whole part of the model an HF weight comes from: layer i, or -1 (embedding) / layers (the rest)."""
        if hf_name.startswith("model.layers."):
            return int(hf_name.split(".")[2])
        return -1 if hf_name.startswith("model.embed_tokens") else self.layout.layers

    def bucket_plan(self, bucket_bytes: int = 64 << 20, changed_only: bool = False) -> list[list[str]]:
        # every parameter trains (no adapters on Megatron): changed_only sends them all
        return bucket_names(((n, self._hf_bytes[n]) for n in sorted(self._hf_bytes, key=self._piece)), bucket_bytes)

    @torch.no_grad()
    def _gather(self, names: list[str]) -> list[tuple[str, torch.Tensor]]:
        """Collective over the replica: the whole pieces ``names`` come from, gathered over TP by the stage that
        holds them and merged into HF names (layers numbered globally), then sent to every stage."""
        pieces, mg = {self._piece(n) for n in names}, self.mg
        offset = mg.stage * (self.layout.layers // mg.pp)
        shards = [dict() for _ in range(self.tp)]
        for name, p in self.model.named_parameters():
            if name.startswith("output_layer.") and self.layout.tied:
                continue  # a later stage's copy of the tied embedding
            if name.startswith("decoder.layers."):
                i, rest = name.removeprefix("decoder.layers.").split(".", 1)
                i = int(i) + offset
                name = f"decoder.layers.{i}.{rest}"
            else:
                i = -1 if name.startswith("embedding.") else self.layout.layers
            if i not in pieces:
                continue
            parts = [p.detach()] * self.tp
            if self.tp > 1 and tp_dim(name) is not None:
                parts = [torch.empty_like(p) for _ in range(self.tp)]
                dist.all_gather(parts, p.detach().contiguous(), group=self.tp_group)
            for r in range(self.tp):
                shards[r][name] = parts[r]
        if mg.ep > 1:  # every EP rank's experts of these pieces, numbered globally
            from core.train.megatron_convert import ep_merge, is_expert

            mine = {n: t.cpu() for n, t in shards[0].items() if is_expert(n)}
            every = [None] * mg.ep
            dist.all_gather_object(every, mine, group=mg.ep_group)
            shards[0] = {n: t for n, t in shards[0].items() if not is_expert(n)} | {
                n: t.to(self.ctx.device) for n, t in ep_merge(every).items()}
        hf = megatron_to_hf(tp_merge(shards), self.layout, partial=True) if shards[0] else {}
        if mg.pp > 1:  # each stage's part to every stage, in stage order
            ranks, parts = dist.get_process_group_ranks(mg.pp_group), {}
            for s, src in enumerate(ranks):
                box = [{n: t.cpu() for n, t in hf.items()} if s == mg.stage else None]
                dist.broadcast_object_list(box, src=src, group=mg.pp_group)
                parts |= box[0]
            hf = {n: t.to(self.ctx.device) for n, t in parts.items()}
        return [(n, hf[n]) for n in names]

    def weight_buckets(self, bucket_bytes: int = 64 << 20, changed_only: bool = False
                       ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        with self.idle.on_gpu():
            for names in self.bucket_plan(bucket_bytes):
                yield self._gather(names)

    def gather_bucket(self, names: list[str], dtype: str | None = None) -> list[tuple[str, torch.Tensor]] | None:
        with self.idle.on_gpu(park=False):  # the next call parks them (as FSDP's)
            bucket = self._gather(names)
        if self.ctx.rank:
            return None
        return [(n, t.to("cpu", getattr(torch, dtype) if dtype else t.dtype)) for n, t in bucket]

