"""FSDP2 critic: a value model (the LM backbone + a scalar head) as a worker role, for PPO-style advantages (GAE).

The model is ``AutoModelForTokenClassification`` with one label: the causal LM's own backbone with a linear
``score`` head (transformers' class for Llama, Qwen2, Mistral, ...; the head starts random, dropout off).
Values are read where log-probs are: the hidden state at position Tp-1+t gives V(s_t) for response token t, so
``values`` (B, Tr) lines up with ``old_logprobs`` and ``token_rewards``. Training minimises the clipped value loss
(``core.algos.value_loss``) against ``returns`` in mini-batches and micro-batches like the actor.
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from core.algos import LossNorm, masked_mean, value_loss
from core.checkpoint import answer_probe
from core.config import CriticConfig
from core.train.forward import trim_padding
from core.train.micro_batches import (equalise_passes, global_counts, length_order, micro_batches, reshuffle_seed,
                                       restore_order)
from core.train.shared_prompt import prompt_groups, shared_prompt_values
from core.train.sharding import FSDPEngine, IdleOffload, adamw_with_warmup, load_sharded_causal_lm
from core.protocol import Batch
from core.worker import WorkerContext


def response_values(model, batch: Batch, remove_padding: bool = True, share_prompt: bool = False) -> torch.Tensor:
    """V(s_t) for every response token t (B, Tr) in fp32; zeros on trimmed padding columns. ``share_prompt``:
    rows with the same prompt run as one packed row, the prompt encoded once (``core.train.shared_prompt``,
    exact, as the actor's log-probs)."""
    batch.require("input_ids", "attention_mask", "position_ids", "responses")
    full = batch["responses"].shape[1]
    if remove_padding:
        batch = trim_padding(batch)
    Tr = batch["responses"].shape[1]
    groups = prompt_groups(batch) if share_prompt else None
    if groups is not None and len(groups) < len(batch):
        values = shared_prompt_values(model, batch, groups).float()
    else:
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    position_ids=batch["position_ids"])
        values = out.logits[:, -Tr - 1:-1, 0].float()
    return F.pad(values, (0, full - Tr)) if Tr < full else values


class ValueWorker:
    """The critic role as the controller calls it, whatever engine holds the value model: ``FSDPCritic`` (here,
    ``critic.strategy: fsdp``) or ``MegatronCritic`` (core/train/megatron_critic.py). The value pass and the
    clipped value-loss update are shared; an engine supplies ``_values`` (V of a micro-batch's response tokens),
    ``_step``, ``_resident``, ``_counts``, ``dp`` and checkpoints."""

    ctx: WorkerContext
    cfg: CriticConfig
    dp: int

    def _values(self, mb: Batch) -> torch.Tensor:
        raise NotImplementedError

    def _step(self) -> float:
        raise NotImplementedError

    def _resident(self, optim: bool = False):
        return nullcontext()

    def _counts(self, mask: torch.Tensor) -> tuple[float, float]:
        return global_counts(mask, self.ctx.device)

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> Batch:
        """``values`` (B, Tr) of the responses, in micro-batches."""
        self.model.eval()
        order = length_order(batch) if self.cfg.max_tokens_per_micro > 0 else None
        micros = micro_batches(batch if order is None else batch.index(order), self.cfg.micro_batch_size,
                               self.cfg.max_tokens_per_micro)
        parts = []
        with self._resident():
            for mb in equalise_passes(micros, self.ctx.device):  # equal forwards on every rank (collectives inside)
                v = self._values((micros[0] if mb is None else mb).to(self.ctx.device))
                if mb is not None:  # a padding pass is dropped
                    parts.append(v.cpu())
        values = torch.cat(parts)
        return Batch({"values": values if order is None else restore_order(values, order)})

    def update(self, batch: Batch) -> dict[str, float]:
        """Value-loss epochs over this rank's share of the step batch; one optimizer step per mini-batch.
        Keys: the model inputs, responses, response_mask, values (old), returns."""
        with self._resident(optim=True):
            return self._update(batch)

    def _update(self, batch: Batch) -> dict[str, float]:
        cfg, dp = self.cfg, self.dp
        if cfg.ppo_mini_batch_size % dp:
            raise ValueError(f"critic.ppo_mini_batch_size {cfg.ppo_mini_batch_size} is not divisible by {dp} DP ranks")
        self.model.train()
        losses, clipfracs, vpreds, norms = [], [], [], []
        shuffle_seed = reshuffle_seed(cfg.ppo_epochs)
        for epoch in range(cfg.ppo_epochs):
            for mini in batch.minibatches(cfg.ppo_mini_batch_size // dp, seed=shuffle_seed + epoch, shuffle=epoch > 0):
                tokens, seqs = self._counts(mini["response_mask"])
                norm = LossNorm(cfg.loss_agg_mode, tokens, seqs, dp, float(mini["response_mask"].shape[-1]))
                loss_sum = 0.0
                for mb in equalise_passes(micro_batches(mini, cfg.micro_batch_size, cfg.max_tokens_per_micro),
                                          self.ctx.device):
                    dummy = mb is None
                    mb = (mini.index(slice(0, 1)) if dummy else mb).to(self.ctx.device)
                    v = self._values(mb)
                    loss, m = value_loss(v, mb, cfg.cliprange_value, norm)
                    (loss * 0.0 if dummy else loss).backward()
                    if not dummy:
                        loss_sum += loss.item() / dp  # this rank's part: the controller sums the parts
                        clipfracs.append(float(m["vf_clipfrac"]))
                        vpreds.append(float(masked_mean(v.detach(), mb["response_mask"].to(v.dtype))))
                losses.append(loss_sum)
                norms.append(self._step())
        mean = lambda xs: sum(xs) / max(len(xs), 1)  # noqa: E731
        return {"critic/vf_loss": mean(losses), "critic/vf_clipfrac": mean(clipfracs),
                "critic/vpred_mean": mean(vpreds), "critic/grad_norm": mean(norms),
                "critic/lr": self.optim.param_groups[0]["lr"]}

    def save_checkpoint(self, path: str) -> None:
        """Collective: model, optimizer, scheduler and RNG states under ``path``."""
        raise NotImplementedError

    def load_checkpoint(self, path: str) -> None:
        raise NotImplementedError

    def answer_probe(self, folder: str, token: str, role: str = "critic") -> str:
        """This rank's half of the check that ``output_dir`` is shared storage (``core.checkpoint.write_probe``),
        answering as ``<role>_rank<rank>`` (the implicit PRM is a policy too: role ``prm``)."""
        return answer_probe(folder, token, f"{role}_rank{self.ctx.rank}")


class FSDPCritic(FSDPEngine, ValueWorker):
    """A value model on FSDP2: values for any batch; clipped value-loss updates."""

    def __init__(self, ctx: WorkerContext, cfg: CriticConfig):
        from core.models import resolve_dtype

        self.ctx, self.cfg, self.dp = ctx, cfg, ctx.world_size
        # the 1-output head's (B, T, 1) logits are a view of its matmul's 2D result, so FSDP2 warned on every
        # forward that an in-place op on them would skip a hook; nothing here writes into them (response_values
        # slices and copies out of place)
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .*ForTokenClassification\) returned a view")
        torch.manual_seed(cfg.seed)  # the score head's init: the same on every rank
        # shard by shard, as the actor: the full fp32 model on every rank would be 128 GB per rank for a 32B critic
        self.model = load_sharded_causal_lm(cfg.model, ctx, resolve_dtype(cfg.dtype, ctx.device), cfg.offload,
                                            "critic", cfg.gradient_checkpointing, value_head=True)
        self.optim, self.sched = adamw_with_warmup(self.model, cfg.optim)
        self.idle = IdleOffload(self.model, self.optim, ctx.device, cfg.offload == "idle")

    def _values(self, mb: Batch) -> torch.Tensor:
        return response_values(self.model, mb, self.cfg.remove_padding, self.cfg.share_prompt)

