"""Typed knobs of the algorithm library (validated once by ``core.config.validate``, frozen)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AdvantageConfig:
    # estimator name, one of core.algos.ADVANTAGES
    estimator: str = "grpo"
    # discount factor
    gamma: float = 1.0
    # GAE lambda (for decoupled GAE: the actor's lambda)
    lam: float = 1.0
    # VAPO decoupled GAE: lambda for the critic's value targets
    lam_critic: float = 1.0
    # VAPO length-adaptive GAE: lambda_i = 1 - 1 / (alpha * length_i)
    length_alpha: float = 0.05
    # GRPO: divide by the group std (false = Dr.GRPO)
    norm_by_std: bool = True
    # added to the std before dividing
    epsilon: float = 1e-6
    # SPPO: temperature beta of the soft-mean baseline
    sppo_beta: float = 1.0
    # GPG: normalising constant f_norm
    gpg_f_norm: float = 1.0


@dataclass(frozen=True)
class PolicyLossConfig:
    # loss name, one of core.algos.POLICY_LOSSES
    name: str = "vanilla"
    # PPO ratio clip: [1 - clip_low, 1 + clip_high] (DAPO clip-higher: 0.2 / 0.28)
    clip_low: float = 0.2
    clip_high: float = 0.2
    # dual-clip constant c (> 1) bounding the loss for negative advantages
    dual_clip_c: float = 3.0
    # Clip-Cov: fraction of tokens whose gradient is cut, and the covariance window they are drawn from
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    # KL-Cov: fraction of highest-covariance tokens given a KL penalty, and its coefficient
    kl_cov_ratio: float = 0.0002
    kl_cov_coef: float = 1.0
    # CISPO: importance-weight clip [1 - low, 1 + high] (the paper leaves the lower side open)
    cispo_clip_low: float = 1.0
    cispo_clip_high: float = 0.28
    # SPPO: eta scaling the advantage target of the squared loss
    sppo_eta: float = 1.0
    # mixed into Clip-Cov's random token choice (each call also draws from the process's torch RNG)
    seed: int = 0
