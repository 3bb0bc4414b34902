"""Off-policy corrections: per-token weights on the advantages for samples drawn by another policy than the one the
loss treats as old -- the rollout engine's kernels and dtype, or weights one or more updates stale (one step off).
Signature: ``fn(old_logprobs, rollout_logprobs, mask, cap) -> weights`` (B, T), 0 on padding; chosen by
``algo.off_policy_correction``, on when ``algo.tis_cap`` (the cap C) > 0. With r_t = pi_old(y_t) / pi_rollout(y_t)
the step's advantages become A_t * w_t: for the PPO-family losses, positively homogeneous in A, that scales each
token's loss by w_t; a weight of 0 takes the token out of the policy gradient (its KL and entropy terms stay).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from core.algos.registry import Registry

OffPolicyFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]
OFF_POLICY: Registry[OffPolicyFn] = Registry("off-policy correction",
                                             ("old_logprobs", "rollout_logprobs", "mask", "cap"))


def _ratio(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """r_t = exp(log pi_old - log pi_rollout), 1 on padding (so padding never trips a bound)."""
    return torch.where(mask > 0, (old_logprobs - rollout_logprobs).exp(), torch.ones_like(old_logprobs))


def _check(cap: float) -> None:
    if cap <= 0:
        raise ValueError(f"an off-policy correction's cap must be > 0, got {cap}")


@OFF_POLICY.register("tis")
def tis(old_logprobs, rollout_logprobs, mask, cap):
    """Truncated importance sampling: w_t = min(r_t, C).

    Paper: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (TIS). The
    weight corrects the gradient's expectation; the cap bounds its variance. Shapes: all (B, T) -> (B, T).
    Example: old = [-1.0, -2.0], rollout = [-1.5, -1.0], C = 1.5 -> r = [e^0.5, e^-1] = [1.6487, 0.3679],
    w = [1.5, 0.3679].
    """
    _check(cap)
    return _ratio(old_logprobs, rollout_logprobs, mask).clamp(max=cap) * (mask > 0)


@OFF_POLICY.register("masked_is")
def masked_is(old_logprobs, rollout_logprobs, mask, cap):
    """Masked importance sampling (IcePop): w_t = r_t where 1/C <= r_t <= C, else 0.

    Reference: IcePop, Ling Team 2025 ("Every Step Evolves: Scaling Reinforcement Learning for Trillion-Scale
    Thinking Model", arXiv:2510.18855): tokens whose engine and trainer probabilities disagree by more than the
    band are masked out of the gradient instead of clipped, so a badly mismatched token cannot steer the update.
    Shapes: all (B, T) -> (B, T).
    Example: old = [-1.0, -2.0, -1.0], rollout = [-1.5, -1.0, -1.1], C = 2 -> r = [1.6487, 0.3679, 1.1052];
    0.3679 < 1/2 -> w = [1.6487, 0.0, 1.1052].
    """
    _check(cap)
    r = _ratio(old_logprobs, rollout_logprobs, mask)
    return torch.where((r >= 1.0 / cap) & (r <= cap), r, torch.zeros_like(r)) * (mask > 0)


@OFF_POLICY.register("seq_mask")
def seq_mask(old_logprobs, rollout_logprobs, mask, cap):
    """Sequence-level masking: w_t = r_t for every token of a sequence whose geometric-mean ratio
    exp(mean_t log r_t) lies in [1/C, C]; the whole sequence gets 0 otherwise.

    Reference: the sequence-level rejection of verl's rollout correction (geometric mean of the token ratios,
    verl 0.6+ ``rollout_rs: geometric``) and GSPO's sequence-level ratio (Zheng et al. 2025, arXiv:2507.18071): one
    decision per response, so a response drawn far from the trainer's policy is dropped whole rather than token by
    token. Shapes: all (B, T) -> (B, T); the mean runs over each row's unmasked tokens.
    Example: row 1 old = [-1.0, -1.0], rollout = [-1.5, -0.7] -> log r = [0.5, -0.3], mean 0.1, e^0.1 = 1.105 in
    [1/2, 2] -> w = [1.6487, 0.7408]; row 2 old = [-1.0, -1.0], rollout = [-2.0, -2.0] -> mean 1.0, e^1 = 2.718 > 2 ->
    w = [0, 0].
    """
    _check(cap)
    valid = mask > 0
    log_r = (old_logprobs - rollout_logprobs) * valid
    mean = log_r.sum(-1) / valid.sum(-1).clamp(min=1)
    bound = math.log(cap)
    keep = (mean >= -bound) & (mean <= bound)
    return _ratio(old_logprobs, rollout_logprobs, mask) * keep[:, None] * valid


def off_policy_metrics(batch, tis_cap: float, correction: str) -> dict[str, float]:
    """The metrics of a step's off-policy samples. Async runs (one step off, streaming): the weight version of the
    samples' oldest tokens and their staleness (updates behind the policy that trains on them), the share of
    samples spanning versions (partial rollouts), and mean |pi_old / pi_rollout - 1| of the tokens of each
    staleness; with a correction (``tis_cap`` > 0), its mean weight and the share of tokens whose weight is not
    their ratio (clipped or masked). ``batch``: a step's ``core.protocol.Batch`` (``response_mask``,
    ``rollout_logprobs``, ``old_logprobs``; ``staleness``, ``policy_version``, ``rollout_versions`` when async)."""
    out = {}
    if "staleness" in batch:
        mask = batch["response_mask"]
        versions = torch.where(mask > 0, batch["rollout_versions"], batch["policy_version"][:, None])
        out = {"rollout/policy_version": float(batch["policy_version"].mean()),
               "rollout/staleness_mean": float(batch["staleness"].mean()),
               "rollout/staleness_max": float(batch["staleness"].max()),
               # partial rollouts: samples whose tokens come from more than one weight version
               "rollout/partial_frac": float((versions.amax(-1) > versions.amin(-1)).float().mean())}
        if "old_logprobs" in batch:  # how far pi_old / pi_rollout strays from 1, by each token's staleness
            ratio_dev = ((batch["old_logprobs"] - batch["rollout_logprobs"]).exp() - 1).abs()
            token_staleness = (batch["policy_version"] + batch["staleness"])[:, None] - versions
            for k in token_staleness[mask > 0].unique().tolist():
                at = (token_staleness == k) & (mask > 0)
                out[f"rollout/ratio_dev/staleness_{int(k)}"] = float(ratio_dev[at].mean())
    if tis_cap > 0:
        mask = batch["response_mask"]
        ratio = (batch["old_logprobs"] - batch["rollout_logprobs"]).exp()
        weights = OFF_POLICY[correction](batch["old_logprobs"], batch["rollout_logprobs"], mask, tis_cap)
        changed = ((weights - ratio).abs() > 1e-6 * ratio.abs().clamp(min=1)).float() * mask
        out |= {"rollout/tis_weight_mean": float((weights * mask).sum() / mask.sum().clamp(min=1)),
                "rollout/tis_clip_frac": float(changed.sum() / mask.sum().clamp(min=1))}
    return out
