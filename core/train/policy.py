"""The policy role -- the actor (trainable) and the frozen reference -- as the controller calls it, whatever engine
holds the weights: ``FSDPActor`` (core/train/fsdp.py, ``actor.strategy: fsdp``) or ``MegatronActor``
(core/train/megatron_actor.py, ``actor.strategy: megatron``).

The controller dispatches the methods of this class (``roles.actor.dp_split(PolicyWorker.compute_logprobs, b)``);
the worker group runs the role's own (``core.worker_group`` accepts a method of a role's base class). What every
engine shares lives here: the log-prob pass over micro-batches and the PPO update with its loss contract -- the
policy-loss registry per micro-batch, normalised by the mini-batch's token / sequence counts over the DP ranks
(``LossNorm``), so neither the micro-batch nor the DP split changes the gradient. An engine supplies the forward,
the optimizer step, its data-parallel size and counts, and the weight export / checkpoint methods.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import ContextManager, Iterator

import torch

from core.algos import POLICY_LOSSES, LossNorm, entropy_bonus, positive_nll_loss
from core.algos.kl import kl_loss
from core.algos.ops import masked_mean
from core.checkpoint import answer_probe
from core.determinism import weights_sha256
from core.config import ActorConfig
from core.train.micro_batches import (equalise_passes, global_counts, length_order, micro_batches, reshuffle_seed,
                                       restore_order)
from core.protocol import Batch
from core.weight_delta import Bucket
from core.worker import WorkerContext


def bucket_names(sizes, bucket_bytes: int) -> list[list[str]]:
    """(name, bytes) pairs in order -> consecutive names grouped into buckets of about ``bucket_bytes`` (a bucket
    closes once it reaches the size): the weight-sync plan of every engine."""
    plan, bucket, size = [], [], 0
    for name, nbytes in sizes:
        bucket.append(name)
        size += nbytes
        if size >= bucket_bytes:
            plan.append(bucket)
            bucket, size = [], 0
    return plan + [bucket] if bucket else plan


class PolicyWorker:
    """A policy on some training engine. Subclasses set ``ctx``, ``cfg``, ``model``, ``optim`` / ``sched`` (None when
    frozen), ``dp`` (data-parallel ranks: peers that see the same rows count once), ``routers``
    (``core.train.moe.RouterStats``) and ``_filled_old = None``, and implement the engine hooks below."""

    ctx: WorkerContext
    cfg: ActorConfig
    dp: int

    # ---------------------------------------------------------------------------------- engine hooks
    def _forward(self, mb: Batch, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log pi(response_t | context) (B, Tr) under logits / temperature, and the entropy when asked."""
        raise NotImplementedError

    def _step(self) -> float:
        """Clip and apply the accumulated gradients (one optimizer step); the global gradient norm."""
        raise NotImplementedError

    def _resident(self, optim: bool = False) -> ContextManager:
        """Where the weights (and optimizer state) must be on the device for a call (offloading engines)."""
        return nullcontext()

    def _counts(self, mask: torch.Tensor) -> tuple[float, float]:
        """Tokens and sequences of a mini-batch summed over the DP ranks."""
        return global_counts(mask, self.ctx.device)

    # ---------------------------------------------------------------------------------- log-probs
    @torch.no_grad()
    def compute_logprobs(self, batch: Batch, with_entropy: bool = False, leave_to_update: bool = False) -> Batch:
        """``old_logprobs`` of the responses, in micro-batches (plus ``entropy`` when asked: a full-vocabulary
        softmax per token, so only on request). Returns a Batch of those keys.

        ``leave_to_update``: the rows this actor's next ``update`` trains on before its first optimizer step (its
        first mini-batch, with one PPO epoch) are not computed here. The policy has not moved when the update reaches
        them, so its own forward gives the same numbers (the ratio is exactly 1 there): one forward saved per such
        row. They come back as NaN with ``old_from_update`` True, and ``update_old_logprobs`` returns them after
        the update. Only for a step where nothing before the update reads ``old_logprobs`` (no KL-in-reward, no
        truncated IS); with several PPO epochs or with ``with_entropy`` every row is computed here."""
        skip = self._rows_before_first_step(len(batch)) if leave_to_update and not with_entropy else 0
        rest = batch.index(slice(skip, len(batch))) if skip else batch
        self.model.eval()
        order = length_order(rest) if self.cfg.max_tokens_per_micro > 0 else None
        logps, ents = [], []
        micros = micro_batches(rest if order is None else rest.index(order), self.cfg.micro_batch_size,
                               self.cfg.max_tokens_per_micro) if len(rest) else []
        with self._resident():
            for lp, ent in self._forward_passes(micros, batch.index(slice(0, 1)), with_entropy):
                logps.append(lp.cpu())
                if with_entropy:
                    ents.append(ent.cpu())
        width = batch["responses"].shape[1]
        out = {"old_logprobs": torch.cat(logps) if logps else torch.zeros(0, width)}
        out |= {"entropy": torch.cat(ents)} if with_entropy else {}
        if order is not None:
            out = {k: restore_order(v, order) for k, v in out.items()}
        if leave_to_update:
            out["old_logprobs"] = torch.cat([torch.full((skip, width), float("nan")), out["old_logprobs"]])
            out["old_from_update"] = torch.arange(len(batch)) < skip
        return Batch(out)

    def _forward_passes(self, micros: list[Batch], spare: Batch, with_entropy: bool):
        """(log-probs, entropy) of each micro-batch, without gradients. As many forwards as the rank with the most
        micro-batches (collectives inside pair up across ranks): a padding pass reruns the first micro-batch (or
        ``spare``, a row of the batch) and is dropped."""
        for mb in equalise_passes(micros, self.ctx.device):
            lp, ent = self._forward((mb if mb is not None else micros[0] if micros else spare).to(self.ctx.device),
                                    with_entropy)
            if mb is not None:
                yield lp, ent

    def _train_passes(self, micros: list[Batch], spare: Batch, with_entropy: bool, loss_of) -> None:
        """Forward and backward of each micro-batch: ``loss_of(mb, logp, entropy, dummy)`` is its loss (padding
        passes, as in ``_forward_passes``, have ``dummy`` True and are multiplied by 0)."""
        for mb in equalise_passes(micros, self.ctx.device):
            dummy = mb is None
            mb = (spare if dummy else mb).to(self.ctx.device)
            logp, ent = self._forward(mb, with_entropy)
            loss = loss_of(mb, logp, ent, dummy)
            (loss * 0.0 if dummy else loss).backward()

    def _metrics(self, out: dict[str, float]) -> dict[str, float]:
        """The update's metrics as the controller gets them from this rank (pipeline stages: the last stage's)."""
        return out

    def _rows_before_first_step(self, rows: int) -> int:
        """How many of this rank's ``rows`` its next update trains on before the policy first moves."""
        if self.optim is None or self.cfg.ppo_epochs != 1:
            return 0
        return min(rows, self.cfg.ppo_mini_batch_size // self.dp)

    def update_old_logprobs(self, batch: Batch) -> Batch:
        """This rank's ``old_logprobs`` as its last ``update`` used them: those ``compute_logprobs(...,
        leave_to_update=True)`` left to it filled in from the update's first forward (for the step's metrics).
        ``batch``: the rank's share of the batch that was updated (dispatch only: its rows must match)."""
        if self._filled_old is None or len(self._filled_old) != len(batch):
            raise RuntimeError(f"rank {self.ctx.rank}: no update with old log-probs left to it ran on these "
                               f"{len(batch)} rows")
        return Batch({"old_logprobs": self._filled_old})

    # ---------------------------------------------------------------------------------- update
    def update(self, batch: Batch) -> dict[str, float]:
        """PPO epochs over this rank's share of the step batch; one optimizer step per mini-batch."""
        if self.optim is None:
            raise RuntimeError("update() on a frozen policy (trainable=false)")
        with self._resident(optim=True):
            return self._update(batch)

    def _update(self, batch: Batch) -> dict[str, float]:
        cfg, dp = self.cfg, self.dp
        if cfg.ppo_mini_batch_size % dp:
            raise ValueError(f"ppo_mini_batch_size {cfg.ppo_mini_batch_size} is not divisible by {dp} DP ranks")
        self.model.train()
        loss_fn = POLICY_LOSSES[cfg.loss.name]
        if cfg.positive_nll_coef > 0:
            batch.require("scores")  # which samples are correct
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}

        def add(key, value, n=1):
            sums[key] = sums.get(key, 0.0) + float(value)
            counts[key] = counts.get(key, 0) + n

        # rows whose old log-probs compute_logprobs left to this update: taken from the first forward below
        fill = "old_from_update" in batch
        self._filled_old = None
        if fill:
            if bool(batch["old_from_update"][self._rows_before_first_step(len(batch)):].any()):
                raise ValueError(f"rank {self.ctx.rank}: old log-probs were left to the update for rows it does not "
                                 f"reach before its first optimizer step (ppo_epochs={cfg.ppo_epochs})")
            batch = batch.union(Batch({"row": torch.arange(len(batch))}))
            self._filled_old = batch["old_logprobs"].clone()
        shuffle_seed = reshuffle_seed(cfg.ppo_epochs)
        self.routers.reset()
        for epoch in range(cfg.ppo_epochs):
            for mini in batch.minibatches(cfg.ppo_mini_batch_size // dp, seed=shuffle_seed + epoch, shuffle=epoch > 0):
                tokens, seqs = self._counts(mini["response_mask"])
                norm = LossNorm(cfg.loss_agg_mode, tokens, seqs, dp, float(mini["response_mask"].shape[-1]))
                if cfg.positive_nll_coef > 0:  # the NLL's own denominator: correct samples' tokens, all ranks
                    positive = mini["response_mask"] * (mini["scores"] > 0).to(mini["response_mask"].dtype)[:, None]
                    nll_norm = LossNorm("token-mean", self._counts(positive)[0], seqs, dp)
                if cfg.max_tokens_per_micro > 0:  # the loss sums over the mini-batch: row order is free
                    mini = mini.index(length_order(mini))

                def loss_of(mb: Batch, logp: torch.Tensor, ent: torch.Tensor | None, dummy: bool) -> torch.Tensor:
                    if fill:
                        mb = self._fill_old(mb, logp, dummy)
                    pg, m = loss_fn(logp, mb, cfg.loss, norm)
                    loss = pg
                    if cfg.kl_loss_coef > 0:
                        kl = kl_loss(logp, mb, cfg.kl_loss_type, norm)
                        loss = loss + cfg.kl_loss_coef * kl
                        if not dummy:  # a padding pass's loss is multiplied by 0 (_train_passes): no part of it
                            add("actor/kl_loss", kl.item() / dp)
                    if cfg.entropy_coef > 0:
                        loss = loss - cfg.entropy_coef * entropy_bonus(ent, mb["response_mask"], norm)
                    if cfg.positive_nll_coef > 0:
                        nll = positive_nll_loss(logp, mb, nll_norm)
                        loss = loss + cfg.positive_nll_coef * nll
                        if not dummy:
                            add("actor/nll_loss", nll.item() / dp)
                    if not dummy:
                        add("actor/pg_loss", pg.item() / dp)
                        for k, v in m.items():
                            add(f"actor/{k}", v.item())
                        add("actor/entropy", masked_mean(ent.detach() if ent is not None else logp.detach().neg(),
                                                         mb["response_mask"]).item())
                    return loss

                self._train_passes(micro_batches(mini, cfg.micro_batch_size, cfg.max_tokens_per_micro),
                                   mini.index(slice(0, 1)), cfg.entropy_coef > 0, loss_of)
                grad_norm = self._step()
                add("actor/grad_norm", grad_norm)
                add("actor/nonfinite_grad_frac", float(not math.isfinite(grad_norm)))  # optimizer steps skipped
        out = {k: sums[k] / counts[k] for k in sums if not k.endswith("_loss")} | self.routers.metrics("actor/")
        # loss values are sums over micro-batches of parts of one mini-batch's loss: average per mini-batch
        n_mini = counts.get("actor/grad_norm", 1)
        out |= {k: sums[k] / n_mini for k in sums if k.endswith("_loss")}
        out["actor/lr"] = self.optim.param_groups[0]["lr"]
        return self._metrics(out)

    # ---------------------------------------------------------------------------------- supervised fine-tuning
    def sft_update(self, batch: Batch) -> dict[str, float]:
        """One optimizer step of supervised fine-tuning on this rank's packed rows (``core.sft``: keys
        ``input_ids``, ``position_ids``, ``segment``, ``loss_mask``, (R, T) each): the mean negative
        log-likelihood of every trained token of the step, over all DP ranks' rows, ``micro_batch_size`` rows a
        pass. Returns ``sft/nll_loss`` (this rank's part of that mean: ``reduce_over_ranks`` sums the parts),
        ``sft/tokens`` (the step's trained tokens), ``actor/grad_norm`` and ``actor/lr``."""
        from core.sft.packing import Packed
        from core.train.sft_loss import token_nll

        if self.optim is None:
            raise RuntimeError("sft_update() on a frozen policy (trainable=false)")
        batch.require("input_ids", "position_ids", "segment", "loss_mask")
        same = batch["segment"][:, 1:] == batch["segment"][:, :-1]
        trained, _ = self._counts(batch["loss_mask"][:, 1:] * same)
        with self._resident(optim=True):
            self.model.train()
            micros = batch.split(max(self.cfg.micro_batch_size, 1))
            nll_sum = 0.0
            for mb in equalise_passes(micros, self.ctx.device):
                dummy = mb is None
                mb = (micros[0] if dummy else mb).to(self.ctx.device)
                nll, _ = token_nll(self.model, Packed(mb["input_ids"], mb["position_ids"], mb["segment"],
                                                      mb["loss_mask"]))
                # FSDP averages the ranks' gradients: x dp makes them the gradient of the whole step's mean
                loss = nll * self.dp / max(trained, 1.0)
                (loss * 0.0 if dummy else loss).backward()
                nll_sum += 0.0 if dummy else float(nll.detach())
            grad_norm = self._step()
        return self._metrics({"sft/nll_loss": nll_sum / max(trained, 1.0), "sft/tokens": trained,
                              "actor/grad_norm": grad_norm, "actor/lr": self.optim.param_groups[0]["lr"]})

    def _fill_old(self, mb: Batch, logp: torch.Tensor, dummy: bool) -> Batch:
        """The micro-batch with its left-to-update rows' old log-probs set to this forward's (before any
        optimizer step, so the same policy); kept for ``update_old_logprobs`` unless a padding pass."""
        rows = mb["old_from_update"].bool()
        if not bool(rows.any()):
            return mb
        old = torch.where(rows[:, None], logp.detach(), mb["old_logprobs"])
        if not dummy:
            self._filled_old[mb["row"][rows].cpu()] = old[rows].cpu().to(self._filled_old.dtype)
        mb["old_logprobs"] = old  # mb is this pass's own Batch (``.to(device)`` made it)
        return mb

    # ---------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, path: str) -> None:
        """Collective: model, optimizer, scheduler and RNG states under ``path``."""
        raise NotImplementedError

    def load_checkpoint(self, path: str) -> None:
        """Collective: the state ``save_checkpoint`` wrote, into this policy."""
        raise NotImplementedError

    def answer_probe(self, folder: str, token: str, role: str = "actor") -> str:
        """This rank's half of the check that ``output_dir`` is shared storage (``core.checkpoint.write_probe``),
        answering as ``<role>_rank<rank>`` (the implicit PRM is a policy too: role ``prm``)."""
        return answer_probe(folder, token, f"{role}_rank{self.ctx.rank}")

    # ---------------------------------------------------------------------------------- weight export (HF names)
    def bucket_plan(self, bucket_bytes: int = 64 << 20, changed_only: bool = False) -> list[list[str]]:
        """HF parameter names grouped into buckets of about ``bucket_bytes`` of full tensors (the same on every
        rank; no collective). ``changed_only``: only the weights an update can change (those made of a trainable
        parameter): a LoRA actor's adapted linears, after the first sync has sent the frozen rest."""
        raise NotImplementedError

    def weight_buckets(self, bucket_bytes: int = 64 << 20, changed_only: bool = False
                       ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Full parameters in HF names (``bucket_plan``'s), gathered one bucket at a time. Collective: every rank
        must iterate."""
        raise NotImplementedError

    def gather_bucket(self, names: list[str], dtype: str | None = None) -> list[tuple[str, torch.Tensor]] | None:
        """Collective: every rank gathers these full parameters; rank 0 returns them on CPU (cast to ``dtype``, the
        receiving engine's, to halve the bytes that travel), the others None. For a rollout on another pool."""
        raise NotImplementedError

    def sends_shards(self) -> bool:
        """Whether ``shard_bucket`` works here: each rank encodes its own shard of each weight (delta syncs)."""
        return False

    def shard_bucket(self, names: list[str], dtype: str, base: str | None, sync_id: str) -> Bucket:
        """This rank's shard of each of ``names``, cast to ``dtype`` (the receiver's), encoded against what the
        receiver holds (``core.weight_delta``): a delta where this rank's shadow of the weight is from sync
        ``base``, else its values; the shadow becomes sync ``sync_id``'s. No collective."""
        raise NotImplementedError

    def weights_sha256(self, dtype: str | None = None) -> str:
        """Collective: the digest of the full weights (``core.determinism.weights_sha256`` over ``weight_buckets``),
        the same on every rank; equal digests, equal weights bit for bit. ``dtype``: of the weights cast to it
        (a receiving engine's)."""
        buckets = self.weight_buckets()
        if dtype is not None:
            buckets = ([(n, t.to(getattr(torch, dtype))) for n, t in b] for b in buckets)
        return weights_sha256(buckets)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """All full parameters on CPU in HF names (tests and export; a whole-model copy, unlike ``weight_buckets``)."""
        return {n: t.cpu().clone() for bucket in self.weight_buckets() for n, t in bucket}
