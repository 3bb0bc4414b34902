"""KL between the policy and the reference, per token; controllers for its coefficient; KL as a reward penalty.

Signature of a KL kind: ``fn(logprobs, ref_logprobs) -> (B, T)`` estimate of KL(pi || pi_ref) per token, from the
sampled tokens' log-probs. A ``+`` suffix (``k1+``, ``k3+``, ...) keeps the forward value of that estimator but
takes the gradient of ``k2`` (straight-through), whose gradient is unbiased for the KL's gradient (verl).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from core.algos.ops import masked_mean
from core.algos.registry import Registry
from core.protocol import Batch

KLFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
KL_KINDS: Registry[KLFn] = Registry("KL kind", ("logprobs", "ref_logprobs"))


@KL_KINDS.register("k1", "kl")
def k1(logprobs, ref_logprobs):
    """k1 = logp - logp_ref (unbiased for KL, high variance, can be negative).  Shapes (B, T).
    Reference: Schulman 2020, "Approximating KL Divergence" (joschu.net/blog/kl-approx.html).
    Example: logp = -1, logp_ref = -2 -> 1.0.
    """
    return logprobs - ref_logprobs


@KL_KINDS.register("abs")
def abs_kl(logprobs, ref_logprobs):
    """|logp - logp_ref|.  Shapes (B, T).  Reference: verl's ``kl_penalty(..., "abs")``.
    Example: logp = -2, logp_ref = -1 -> 1.0.
    """
    return (logprobs - ref_logprobs).abs()


@KL_KINDS.register("k2", "mse")
def k2(logprobs, ref_logprobs):
    """k2 = 0.5 (logp - logp_ref)^2 (low variance, biased; its gradient is unbiased).  Shapes (B, T).
    Reference: Schulman 2020, "Approximating KL Divergence".
    Example: logp = -1, logp_ref = -2 -> 0.5.
    """
    return 0.5 * (logprobs - ref_logprobs).square()


@KL_KINDS.register("k3", "low_var_kl")
def k3(logprobs, ref_logprobs):
    """k3 = exp(d) - d - 1 with d = logp_ref - logp (clamped to [-20, 20]); result clamped to [-10, 10].
    Unbiased and non-negative.  Shapes (B, T).  Reference: Schulman 2020; GRPO (arXiv:2402.03300) Eq. 4.
    Example: logp = -1, logp_ref = -2 -> d = -1 -> e^-1 + 1 - 1 = 0.3679.
    """
    d = (ref_logprobs - logprobs).clamp(-20, 20)
    return (d.exp() - d - 1).clamp(-10, 10)


def _straight_through(kind: str) -> KLFn:
    forward = KL_KINDS[kind]

    def fn(logprobs, ref_logprobs):
        back = 0.5 * (logprobs - ref_logprobs).square()
        return back - back.detach() + forward(logprobs, ref_logprobs).detach()

    fn.__name__ = f"{forward.__name__}_plus"
    fn.__doc__ = (f"Straight-through {kind}+: value = {kind}(logp, logp_ref), gradient = that of k2, i.e. "
                  f"d/dlogp = logp - logp_ref.  Shapes (B, T).\n"
                  f"    Reference: verl's kl_penalty('{kind}+'); k2's gradient is the unbiased KL gradient "
                  f"(Schulman 2020, \"Approximating KL Divergence\").\n"
                  f"    Example: logp = -1, logp_ref = -2 -> value {kind}(-1, -2), d/dlogp = 1.0.")
    return fn


for _kind in ("k1", "abs", "k2", "k3", "low_var_kl", "mse"):
    KL_KINDS.register(f"{_kind}+")(_straight_through(_kind))


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    return KL_KINDS[kind](logprobs, ref_logprobs)


def kl_loss(logprobs: torch.Tensor, batch: Batch, kind: str, norm) -> torch.Tensor:
    """KL as a loss term: agg(KL_kind(logp, logp_ref)) with the run's aggregation; the actor adds coef * this.
    Keys: ref_logprobs, response_mask (B, T). Example (k2, token-mean): d = [1, -1] -> (0.5 + 0.5) / 2 = 0.5."""
    from core.algos.aggregate import aggregate

    batch.require("ref_logprobs", "response_mask")
    kl = kl_penalty(logprobs, batch["ref_logprobs"], kind)
    return aggregate(kl, batch["response_mask"].to(kl.dtype), norm)


@dataclass
class FixedKLController:
    """A constant coefficient beta."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


@dataclass
class AdaptiveKLController:
    """beta <- beta * (1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon)  (Ziegler et al. 2019,
    arXiv:1909.08593, Sec. 2.2). Example: beta 0.1, KL 0.2, target 0.1, n 64, horizon 640 -> 0.1 * 1.02 = 0.102."""

    value: float
    target: float
    horizon: float

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


def apply_kl_reward_penalty(batch: Batch, controller: FixedKLController | AdaptiveKLController,
                            kind: str = "k1") -> tuple[torch.Tensor, dict[str, float]]:
    """KL as a reward penalty: token_rewards - beta * KL(old || ref) per token, then the controller updates.

    Keys: token_rewards, old_logprobs, ref_logprobs, response_mask. Returns the new (B, T) token rewards and
    metrics; the KL fed to the controller is the mean over sequences of each sequence's token-mean KL (verl).
    """
    batch.require("token_rewards", "old_logprobs", "ref_logprobs", "response_mask")
    mask = batch["response_mask"].to(batch["token_rewards"].dtype)
    kld = kl_penalty(batch["old_logprobs"], batch["ref_logprobs"], kind) * mask
    beta = controller.value
    rewards = batch["token_rewards"] - beta * kld
    current = float(masked_mean(kld, mask, dim=-1).mean())
    controller.update(current, n_steps=len(batch))
    return rewards, {"actor/reward_kl_penalty": current, "actor/reward_kl_penalty_coeff": beta}
