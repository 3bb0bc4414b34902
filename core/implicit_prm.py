"""PRIME's implicit process reward model (Cui et al. 2025, "Process Reinforcement through Implicit Rewards",
arXiv:2502.01456): dense rewards from a reward model that only ever sees outcome labels.

The ``prm`` role (``implicit_prm.enable``) is a causal LM started from the SFT policy and trained online, every step,
with the cross-entropy of its implicit outcome reward z = beta sum_t log(pi_prm / pi_ref) against the verifier's
label (loss ``implicit_prm``, ``core.algos.losses``). Its log-ratio at each token is then a process reward:
r_t = beta (log pi_prm(y_t | y_<t) - log pi_ref(y_t | y_<t)) -- credit assigned token by token without step labels.
It runs on the policy's training engine (``PolicyWorker``: the same update loop, micro-batches, shared-prompt rows,
checkpoints); its reference is the run's reference policy, so it must start from ``actor.model``.

``process_rewards`` is the public step piece (recipes/prime/train.py); the advantage estimator ``prime`` combines its
output with the outcome. Conventions follow verl's recipe/prime (the code behind the published Eurus-2-7B-PRIME):
the last valid token gets no process reward ("token" granularity), and ``batch_norm`` divides the rewards by the
largest |reward-to-go| -- here over the whole step's batch (verl: over each rank's share).
"""

from __future__ import annotations

import torch

from core.algos import masked_mean
from core.algos.advantages import reverse_linear_scan
from core.algos.ops import group_ids, scores_to_token_rewards
from core.config.roles import ImplicitPRMConfig
from core.train.policy import PolicyWorker
from core.loop import Roles, Timer, reduce_over_ranks
from core.protocol import Batch


def process_rewards(roles: Roles, batch: Batch, cfg: ImplicitPRMConfig, timer: Timer) -> dict[str, float]:
    """Train the implicit PRM on this batch's outcome labels (``cfg.update``: before or after scoring it; none: never)
    and set ``prm_logprobs`` and ``process_rewards`` (B, R) = beta (prm_logprobs - ref_logprobs), the last valid token
    0, divided by the batch's largest |reward-to-go| with ``norm: batch_norm``. Needs ``ref_logprobs`` and ``scores``
    (labels in [0, 1]). Returns the PRM's update metrics (``prm/...``) and its ranking accuracy."""
    batch.require("ref_logprobs", "scores", "response_mask", "uid")
    bad = torch.nonzero((batch["scores"] < 0) | (batch["scores"] > 1)).flatten()
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"implicit_prm: outcome labels (scores) must be in [0, 1] (the PRM's cross-entropy target); "
                         f"sample {i} (data_source {batch['data_source'][i]!r}) scored {float(batch['scores'][i]):g}")
    # the PRM's own update takes every row through its forward (no old log-probs left to any update here)
    rows = Batch({k: v for k, v in batch.tensors.items() if k != "old_from_update"}, batch.non_tensors, batch.meta)
    out = {}
    if cfg.update == "before":
        out |= _update(roles, rows, timer)
    with timer("prm"):
        batch["prm_logprobs"] = roles.prm.dp_split(PolicyWorker.compute_logprobs, rows)["old_logprobs"]
    if cfg.update == "after":
        out |= _update(roles, rows, timer)
    mask = batch["response_mask"]
    log_ratio = (batch["prm_logprobs"] - batch["ref_logprobs"]) * mask
    implicit = cfg.beta * log_ratio.sum(-1)  # z_i, the PRM's implicit outcome reward
    rewards = cfg.beta * log_ratio * (mask - scores_to_token_rewards(torch.ones(len(mask)), mask))
    scale = 1.0
    if cfg.norm == "batch_norm":
        to_go = reverse_linear_scan(rewards, torch.ones_like(rewards))
        scale = float(to_go.abs().max()) + 1e-6
    batch["process_rewards"] = rewards / scale
    out |= {"prm/implicit_reward_mean": float(implicit.mean()), "prm/norm_scale": scale,
            "prm/process_reward_mean": float(masked_mean(batch["process_rewards"], mask))}
    acc = ranking_accuracy(implicit, batch["scores"], group_ids(batch["uid"]))
    return out | ({"prm/ranking_acc": acc} if acc is not None else {})


def _update(roles: Roles, rows: Batch, timer: Timer) -> dict[str, float]:
    with timer("update_prm"):
        metrics = reduce_over_ranks(roles.prm.dp_split(PolicyWorker.update, rows))
    # the policy engine's names: its loss is this role's loss (no policy gradient here)
    return {"prm/" + k.removeprefix("actor/").replace("pg_loss", "loss"): v for k, v in metrics.items()}


def ranking_accuracy(implicit: torch.Tensor, labels: torch.Tensor, gid: torch.Tensor) -> float | None:
    """How often the PRM orders two samples of one prompt as their labels do: over the pairs whose labels differ,
    weighted by |y_i - y_j| (verl's ``compute_dpo_accuracy``); None when no group has two different labels.
    Example: z = [2, 1, 0], y = [1, 0, 1], one group -> pairs (0, 1) right, (1, 2) wrong -> 0.5."""
    same = gid[:, None] == gid[None, :]
    dy = labels[:, None] - labels[None, :]
    weight = dy.abs() * same * (dy > 0)  # each differing pair once, the better-labelled sample first
    if float(weight.sum()) == 0:
        return None
    right = (implicit[:, None] > implicit[None, :]).to(weight.dtype)
    return float((weight * right).sum() / weight.sum())
