"""Policy losses. Signature: ``fn(logprobs, batch, cfg: PolicyLossConfig, norm: LossNorm) -> (loss, metrics)``.

``logprobs`` (B, T) are the current policy's log-probs of the response tokens (with grad). From the batch:
``old_logprobs``, ``advantages``, ``response_mask`` (all (B, T)). The loss is aggregated with ``norm`` (see
``core.algos.aggregate``) unless the objective fixes its own aggregation (said in its docstring). Metrics are
detached masked means over this call.

Log-ratio clamps. Token-level ratios (vanilla, clip_cov, kl_cov, cispo, sapo, dppo_*, reinforce's ``token`` weights)
clamp each token's log-ratio to [-20, 20] before ``exp``: a numerical safety net that changes nothing below e^20 (verl
does the same in vanilla, cispo, sapo, dppo, TIS; not in clip_cov / kl_cov); their ppo_kl is the clamped mean, as
verl's vanilla (kl_cov's penalty |log r| and metric use the clamped value too). Losses that sum or average log-ratios
over a sequence take them unclamped -- a per-token clamp would change the sum itself -- and clamp only the sequence's
value, or nothing: gspo mean <= 10 (verl), geo_mean mean <= 20 (ours; verl none), reinforce ``sequence`` sum in
[-20, 20] (verl's TIS), sppo and dro none (no exp; verl). Their ppo_kl, and reinforce's, is the true mean of
logp_old - logp (verl's).
"""

from __future__ import annotations

from typing import Callable

import torch

from core.algos.aggregate import AGGREGATIONS, LossNorm, aggregate, seq_mean
from core.config import PolicyLossConfig
from core.algos.ops import masked_mean
from core.algos.registry import Registry
from core.protocol import Batch

LossFn = Callable[[torch.Tensor, Batch, PolicyLossConfig, LossNorm], tuple[torch.Tensor, dict[str, torch.Tensor]]]
POLICY_LOSSES: Registry[LossFn] = Registry("policy loss", ("logprobs", "batch", "cfg", "norm"))
LOG_RATIO_CLAMP = 20.0


def _inputs(logprobs: torch.Tensor, batch: Batch, clamp: bool = True):
    """(log-ratio, A, mask); clamp=False (sequence-level losses): the true log-ratio, 0 off the mask so that a
    non-finite padding value cannot turn a masked sum into NaN (the clamp used to absorb it)."""
    batch.require("old_logprobs", "advantages", "response_mask")
    mask = batch["response_mask"].to(logprobs.dtype)
    log_ratio = logprobs - batch["old_logprobs"]
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) if clamp else torch.where(mask > 0, log_ratio, 0.0)
    return log_ratio, batch["advantages"], mask


def _clipped_surrogate(ratio, adv, cfg):
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    return pg1, pg2, torch.maximum(pg1, pg2)


# losses that aggregate their own way whatever actor.loss_agg_mode says: core.checks refuses any mode but the
# default and the loss's own (sppo is verl's recipe's, whose "token-mean" is this same mean over samples)
FIXED_AGGREGATION = {"gspo": "seq-mean-token-mean", "geo_mean": "the mean over sequences",
                     "sppo": "seq-mean-token-sum", "sapo": "seq-mean-token-mean"}


@POLICY_LOSSES.register("vanilla")
def vanilla(logprobs, batch, cfg, norm):
    """PPO clipped surrogate with asymmetric clip (clip-higher) and dual clip.

    r = exp(logp - logp_old);  l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high));  for A < 0 additionally
    l = min(l, -c A) (dual clip, c = dual_clip_c > 1). Metrics: pg_clipfrac (clip active), pg_clipfrac_lower
    (dual clip active), ppo_kl = mean(logp_old - logp). Shapes (B, T).
    Papers: PPO, Schulman et al. 2017 (arXiv:1707.06347); dual clip, Ye et al. 2020 (arXiv:1912.09729);
    clip-higher, DAPO (arXiv:2503.14476).
    Example (eps = 0.2, c = 3): A = 1, r = 1.5 -> max(-1.5, -1.2) = -1.2;  A = -1, r = 5 -> max(5, 1.2) = 5,
    dual clip -> min(5, 3) = 3;  A = 1, r = 1 -> -1.
    """
    if cfg.dual_clip_c <= 1:
        raise ValueError(f"dual_clip_c must be > 1, got {cfg.dual_clip_c}")
    log_ratio, adv, mask = _inputs(logprobs, batch)
    pg1, pg2, clipped = _clipped_surrogate(log_ratio.exp(), adv, cfg)
    pg3 = -adv * cfg.dual_clip_c
    losses = torch.where(adv < 0, torch.minimum(pg3, clipped), clipped)
    metrics = {"pg_clipfrac": masked_mean((pg2 > pg1).float(), mask),
               "pg_clipfrac_lower": masked_mean(((clipped > pg3) & (adv < 0)).float(), mask),
               "ppo_kl": masked_mean(-log_ratio, mask)}
    return aggregate(losses, mask, norm), {k: v.detach() for k, v in metrics.items()}


@POLICY_LOSSES.register("gspo")
def gspo(logprobs, batch, cfg, norm):
    """GSPO: one importance ratio per sequence (geometric mean of token ratios), token-level surrogate.

    s_i = exp( mean_t (logp - logp_old) );  per token r_it = sg(s_i) * exp(logp_it - sg(logp_it)) (value s_i,
    gradient of a token ratio); l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)). The token log-ratios are
    averaged unclamped and only log r is clamped to <= 10 (verl), which also stops that sequence's gradient.
    Aggregation is fixed to seq-mean-token-mean. ppo_kl = mean(logp_old - logp), unclamped. Shapes (B, T).
    Paper: Zheng et al. 2025, "Group Sequence Policy Optimization" (arXiv:2507.18071).
    Example: token log-ratios [0.1, 0.3] -> s = exp(0.2) = 1.2214; with A = 1, eps = 0.2: both tokens -1.2 (clipped).
    [30, -22] -> s = e^4 (a per-token clamp to 20 would give e^0); [30, 30] -> e^10.
    """
    log_ratio, adv, mask = _inputs(logprobs, batch, clamp=False)
    seq_log_ratio = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    tok = logprobs - logprobs.detach() + seq_log_ratio.detach()[:, None]
    pg1, pg2, losses = _clipped_surrogate(tok.clamp(max=10.0).exp(), adv, cfg)
    metrics = {"pg_clipfrac": masked_mean((pg2 > pg1).float(), mask), "ppo_kl": masked_mean(-log_ratio, mask)}
    return AGGREGATIONS["seq-mean-token-mean"](losses, mask, norm), {k: v.detach() for k, v in metrics.items()}


@POLICY_LOSSES.register("clip_cov")
def clip_cov(logprobs, batch, cfg, norm):
    """Clip-Cov: PPO clip, plus the gradient cut on a few random tokens of high covariance(A, logp).

    cov_it = (A_it - mean A)(logp_it - mean logp) over valid tokens; among tokens not already clipped with
    cov in (clip_cov_lb, clip_cov_ub), pick max(1, floor(clip_cov_ratio * N_valid)) at random (a fresh draw each
    call from the process's torch RNG, mixed with ``cfg.seed``) and zero their loss. Selection is per call, so the loss depends on the micro-batch split.
    Shapes: logprobs, A, mask (B, T).
    Paper: Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs" (arXiv:2505.22617).
    Example: covs [0.5, 2.0, 7.0], window (1, 5), ratio -> 1 token: only the token with cov 2.0 can be cut.
    """
    log_ratio, adv, mask = _inputs(logprobs, batch)
    pg1, pg2, losses = _clipped_surrogate(log_ratio.exp(), adv, cfg)
    valid = mask > 0
    lp = logprobs.detach()
    cov = (adv - masked_mean(adv, mask)) * (lp - masked_mean(lp, mask))
    window = valid & ~(pg2 > pg1) & (cov > cfg.clip_cov_lb) & (cov < cfg.clip_cov_ub)
    cand = torch.nonzero(window)
    n_cut = min(max(int(cfg.clip_cov_ratio * float(mask.sum())), 1), len(cand))
    keep = torch.ones_like(losses)
    if n_cut:
        # a new draw every call from this process's torch RNG (seeded at start, saved in checkpoints), mixed with
        # cfg.seed: a fixed seed here picked the same positions in every micro-batch of every step
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + int(torch.randint(0, 2**31, ())))
        pick = cand[torch.randperm(len(cand), generator=gen)[:n_cut]]
        keep[pick[:, 0], pick[:, 1]] = 0.0
    metrics = {"pg_clipfrac": masked_mean((keep == 0).float(), mask), "ppo_kl": masked_mean(-log_ratio, mask)}
    return aggregate(losses * keep, mask, norm), {k: v.detach() for k, v in metrics.items()}


@POLICY_LOSSES.register("kl_cov")
def kl_cov(logprobs, batch, cfg, norm):
    """KL-Cov: vanilla policy gradient -A r, plus a KL penalty k |log r| on the top tokens by covariance.

    cov_it = (A_it - mean A)(logp_it - mean logp) over valid tokens; the top max(1, floor(kl_cov_ratio * N))
    tokens get l = -A r + kl_cov_coef |log r|, the rest l = -A r (no clipping). The selection is per call.
    Shapes: logprobs, A, mask (B, T).
    Paper: Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs" (arXiv:2505.22617).
    Example: A = [2, 1, -1], logp = [-0.5, -2, -2] -> cov = [1.333, -0.167, 0.833], top-1 is token 1; with
    log-ratios [0.5, 0, 0] and coef 1: l = [-2 e^0.5 + 0.5, -1, 1] = [-2.7974, -1, 1].
    """
    log_ratio, adv, mask = _inputs(logprobs, batch)
    ratio = log_ratio.exp()
    losses = -adv * ratio
    valid = torch.nonzero(mask.reshape(-1) > 0)[:, 0]
    if len(valid):
        a, lp = adv.reshape(-1)[valid].detach(), logprobs.reshape(-1)[valid].detach()
        cov = (a - a.mean()) * (lp - lp.mean())
        top = valid[torch.topk(cov, max(1, int(len(valid) * cfg.kl_cov_ratio))).indices]
        penalty = torch.zeros_like(losses).reshape(-1)
        penalty[top] = 1.0
        losses = losses + penalty.view_as(losses) * cfg.kl_cov_coef * log_ratio.abs()
    metrics = {"ppo_kl": masked_mean(log_ratio.abs(), mask)}
    return aggregate(losses, mask, norm), {k: v.detach() for k, v in metrics.items()}


@POLICY_LOSSES.register("gpg")
def gpg(logprobs, batch, cfg, norm):
    """GPG: the plain policy gradient, no ratio and no clip.  l = -A * logp.  Shapes (B, T).
    Paper: Chu et al. 2025, "GPG: A Simple and Strong RL Baseline" (arXiv:2504.02546).
    Example: A = [2, -1], logp = [-0.5, -1.0] -> l = [1.0, -1.0]; token-mean = 0.
    """
    _, adv, mask = _inputs(logprobs, batch)
    return aggregate(-adv * logprobs, mask, norm), {}


@POLICY_LOSSES.register("geo_mean")
def geo_mean(logprobs, batch, cfg, norm):
    """GMPO: geometric mean of token ratios per sequence, each clipped in log space before averaging.

    d_t = logp - logp_old; d'_t = sgn(A) min(sgn(A) d_t, sgn(A) clip(d_t, -eps_low, eps_high));
    R_i = exp(min(mean_t d'_t, 20));  l_i = -mean_t(A_it) R_i;  aggregation fixed to the mean over sequences.
    d is not clamped per token (verl): a token keeps its full d on the side its advantage does not clip (d > eps_high
    for A < 0, d < -eps_low for A > 0). The mean's bound 20 is ours, against exp overflow (verl has none); it acts
    only where R would pass e^20. Metrics (verl): with c_t = [d_t outside [-eps_low, eps_high]], pg_clipfrac =
    mean(c [A > 0]), pg_clipfrac_lower = mean(c [A < 0]); ppo_kl = mean(-d), unclamped.
    Shapes: logprobs, A, mask (B, T) -> l (B,).
    Paper: Zhao et al. 2025, "Geometric-Mean Policy Optimization" (arXiv:2507.20673).
    Example: A = 1, d = [0.1, 0.5], eps = 0.2 -> d' = [0.1, 0.2] -> R = exp(0.15) = 1.1618 -> l = -1.1618;
    A = -1, d = [30, 0.1] -> d' = d -> l = e^15.05.
    """
    log_ratio, adv, mask = _inputs(logprobs, batch, clamp=False)
    sgn = torch.sign(adv)
    clamped = log_ratio.clamp(-cfg.clip_low, cfg.clip_high)
    d = sgn * torch.minimum(sgn * log_ratio, sgn * clamped)
    length = mask.sum(-1) + 1e-8
    seq_ratio = ((d * mask).sum(-1) / length).clamp(max=LOG_RATIO_CLAMP).exp()
    seq_adv = (adv * mask).sum(-1) / length
    out = (log_ratio != clamped).float()
    metrics = {"pg_clipfrac": masked_mean(out * (adv > 0), mask),
               "pg_clipfrac_lower": masked_mean(out * (adv < 0), mask), "ppo_kl": masked_mean(-log_ratio, mask)}
    return seq_mean(-seq_adv * seq_ratio, norm), {k: v.detach() for k, v in metrics.items()}


@POLICY_LOSSES.register("cispo")
def cispo(logprobs, batch, cfg, norm):
    """CISPO: REINFORCE weighted by a clipped, stop-gradient importance ratio (no token is dropped).

    l = -sg(clip(r, 1 - cispo_clip_low, 1 + cispo_clip_high)) * A * logp.   Shapes (B, T).
    Paper: MiniMax-M1, MiniMax 2025 (arXiv:2506.13585), Eq. 4.
    Example: r = 1.5, clip high 0.28, A = 1, logp = -0.5 -> l = -1.28 * 1 * (-0.5) = 0.64.
    """
    log_ratio, adv, mask = _inputs(logprobs, batch)
    ratio = log_ratio.exp()
    weight = ratio.clamp(1 - cfg.cispo_clip_low, 1 + cfg.cispo_clip_high).detach()
    metrics = {"pg_clipfrac": masked_mean((weight != ratio).float(), mask), "ppo_kl": masked_mean(-log_ratio, mask)}
    return aggregate(-weight * adv * logprobs, mask, norm), {k: v.detach() for k, v in metrics.items()}


@POLICY_LOSSES.register("sppo")
def sppo(logprobs, batch, cfg, norm):
    """SPPO: squared regression of the sequence log-ratio onto eta times the (SPPO) advantage.

    l_i = ( sum_t (logp - logp_old) - eta * A_i )^2 with A_i the sequence's advantage (``advantages`` is A_i on
    each valid token); aggregation fixed to the mean over sequences; no clamp (verl's recipe). Shapes: (B, T), l (B,).
    Paper: Wu et al. 2024, "Self-Play Preference Optimization" (arXiv:2405.00675).
    Example: log-ratios [0.1, 0.2], A = 0.5, eta = 1 -> (0.3 - 0.5)^2 = 0.04;  [30, 0] -> (30 - 0.5)^2 = 870.25.
    """
    log_ratio, adv, mask = _inputs(logprobs, batch, clamp=False)
    length = mask.sum(-1).clamp(min=1)
    seq_adv = (adv * mask).sum(-1) / length
    losses = ((log_ratio * mask).sum(-1) - cfg.sppo_eta * seq_adv) ** 2
    return seq_mean(losses, norm), {"ppo_kl": masked_mean(-log_ratio, mask).detach()}


@POLICY_LOSSES.register("sapo")
def sapo(logprobs, batch, cfg, norm):
    """SAPO: a smooth gate on the ratio instead of PPO's hard clip.

    r = exp(logp - logp_old);  tau = tau_pos if A > 0 else tau_neg;  l = -A * (4 / tau) * sigmoid(tau (r - 1)).
    Its gradient -A 4 s (1 - s) r grad(logp) (s the sigmoid) is the policy gradient at r = 1 and fades smoothly
    as r leaves 1. Aggregation fixed to seq-mean-token-mean (verl). Shapes (B, T).
    Paper: SAPO, arXiv:2511.20347 (as verl's ``sapo`` loss).
    Example: A = 1, tau = 1, r = e^0.5 = 1.6487 -> -4 sigmoid(0.6487) = -2.6269; r = 1 -> -2.
    """
    log_ratio, adv, mask = _inputs(logprobs, batch)
    tau = torch.where(adv > 0, cfg.sapo_tau_pos, cfg.sapo_tau_neg).to(logprobs.dtype)
    losses = -adv * torch.sigmoid(tau * (log_ratio.exp() - 1)) * 4 / tau
    metrics = {"ppo_kl": masked_mean(-log_ratio, mask).detach()}
    return AGGREGATIONS["seq-mean-token-mean"](losses, mask, norm), metrics


@POLICY_LOSSES.register("dro")
def dro(logprobs, batch, cfg, norm):
    """DRO: the policy gradient with a quadratic penalty on the log-ratio to the old policy.

    l = -(A logp - beta / 2 (logp - logp_old)^2);  gradient -(A - beta (logp - logp_old)) grad(logp). The log-ratio
    is not clamped (verl). Shapes (B, T). ``dro_beta`` > 0 (checked before Ray).
    Paper: direct reward optimisation, as verl's ``dro`` loss (verl cites none; docs/algo/dro.md).
    Example: beta = 0.1, logp = -1, logp_old = -1.5, A = 2 -> -(-2 - 0.05 x 0.25) = 2.0125.
    """
    if cfg.dro_beta <= 0:
        raise ValueError(f"actor.loss.dro_beta must be > 0 with loss dro, got {cfg.dro_beta}")
    batch.require("old_logprobs", "advantages", "response_mask")
    mask = batch["response_mask"].to(logprobs.dtype)
    log_ratio = logprobs - batch["old_logprobs"]
    losses = -(batch["advantages"] * logprobs - 0.5 * cfg.dro_beta * log_ratio ** 2)
    return aggregate(losses, mask, norm), {"ppo_kl": masked_mean(-log_ratio, mask).detach()}


def _dppo(logprobs, batch, cfg, norm, inside: Callable):
    """DPPO's loss given its trust region ``inside(p, p_old, adv) -> bool (B, T)`` (see dppo_tv / dppo_kl)."""
    log_ratio, adv, mask = _inputs(logprobs, batch)
    ratio = log_ratio.exp()
    weight = ratio.clamp(max=cfg.dppo_is_cap).detach()
    valid = inside(logprobs.detach().exp(), batch["old_logprobs"].exp(), adv).to(logprobs.dtype)
    metrics = {"pg_clipfrac": masked_mean(1 - valid, mask),                       # outside the trust region
               "pg_is_capped_frac": masked_mean(((ratio > cfg.dppo_is_cap).to(mask.dtype) * valid), mask),
               "ppo_kl": masked_mean(-log_ratio, mask)}
    return aggregate(-adv * weight * logprobs * valid, mask, norm), {k: v.detach() for k, v in metrics.items()}


@POLICY_LOSSES.register("dppo_tv")
def dppo_tv(logprobs, batch, cfg, norm):
    """DPPO-Binary-TV: the truncated-IS policy gradient on the tokens whose probability moved within a total-
    variation trust region; the others are dropped (no gradient), where PPO's clip keeps a one-sided one.

    p = exp(logp), w = sg(min(r, C));  inside = (p - p_old <= delta_high) for A > 0, (p - p_old >= -delta_low) else;
    l = -A w logp [inside].  Metrics: pg_clipfrac (outside), pg_is_capped_frac (inside with r > C). Shapes (B, T).
    Paper: Qi et al. 2026, "Rethinking the Trust Region in LLM RL" (arXiv:2602.04879).
    Example: delta 0.2, C 3, p_old 0.2 -> p 0.5: A = 1 -> outside, 0;  A = -1 -> inside, l = 2.5 ln 0.5 = -1.7329.
    """
    return _dppo(logprobs, batch, cfg, norm, lambda p, q, adv: torch.where(
        adv > 0, p - q <= cfg.dppo_delta_high, p - q >= -cfg.dppo_delta_low))


@POLICY_LOSSES.register("dppo_kl")
def dppo_kl(logprobs, batch, cfg, norm):
    """DPPO-Binary-KL: as dppo_tv with the trust region the KL between Bernoulli(p_old) and Bernoulli(p) of the
    sampled token, only against moves the advantage pushes (p up for A > 0, down otherwise).

    kl = p_old ln(p_old / p) + (1 - p_old) ln((1 - p_old) / (1 - p));  inside = kl <= delta_high or p <= p_old for
    A > 0, kl <= delta_low or p >= p_old else;  l = -A sg(min(r, C)) logp [inside].  Shapes (B, T).
    Paper: Qi et al. 2026 (arXiv:2602.04879).
    Example: delta 0.05, p_old 0.2 -> p 0.5: kl = 0.1927; A = 1 -> outside, 0;  A = -1 -> inside (p >= p_old),
    l = 2.5 ln 0.5 = -1.7329.
    """
    def inside(p, q, adv):
        kl = q * (q.log() - p.log()) + (1 - q) * ((1 - q + 1e-8).log() - (1 - p + 1e-8).log())
        return torch.where(adv > 0, (kl <= cfg.dppo_delta_high) | (p <= q), (kl <= cfg.dppo_delta_low) | (p >= q))

    return _dppo(logprobs, batch, cfg, norm, inside)


@POLICY_LOSSES.register("reinforce")
def reinforce(logprobs, batch, cfg, norm):
    """REINFORCE with truncated importance weights: l = -w A logp, w = sg(min(pi / pi_old, cap)) per token
    (``reinforce_is: token``) or per sequence (``sequence``: the product of its token ratios, each token getting
    its sequence's), or w = 1 (``""``: GPG's plain gradient). The log weight is clamped to [-20, 20]: per token, or
    for ``sequence`` only its sum of true token log-ratios (verl's TIS). With ``algo.bypass_mode`` pi_old is the
    rollout engine's policy: the weights correct for sampling from it. Metrics: is_weight_mean, is_capped_frac,
    ppo_kl (unclamped, as verl's). Shapes (B, T).
    Paper: Williams 1992; truncated IS as in Yao et al. 2025 (TIS) and verl's bypass mode (``loss_type: reinforce``).
    Example: cap 2, logp = [-1, -1], logp_old = [-1.5, -0.5], A = 1 -> token weights [e^0.5, e^-0.5] =
    [1.6487, 0.6065], l = [1.6487, 0.6065]; sequence: w = e^0 = 1 on both, l = [1, 1];
    sequence, log-ratios [25, -24.5] -> w = e^0.5 (a per-token clamp gave e^(20 - 20) = 1).
    """
    if cfg.reinforce_is not in ("", "token", "sequence"):
        raise ValueError(f"actor.loss.reinforce_is must be '', 'token' or 'sequence', got {cfg.reinforce_is!r}")
    log_ratio, adv, mask = _inputs(logprobs, batch, clamp=False)
    log_w = log_ratio.detach()
    if cfg.reinforce_is == "sequence":
        log_w = (log_w * mask).sum(-1, keepdim=True).expand_as(log_w)
    raw = log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp() if cfg.reinforce_is else torch.ones_like(log_w)
    weight = raw.clamp(max=cfg.reinforce_is_cap)
    metrics = {"is_weight_mean": masked_mean(weight, mask),
               "is_capped_frac": masked_mean((raw > weight).float(), mask), "ppo_kl": masked_mean(-log_ratio, mask)}
    return aggregate(-weight * adv * logprobs, mask, norm), {k: v.detach() for k, v in metrics.items()}


# not a policy's loss: the implicit PRM's (PRIME), trained on outcome labels through the same update loop; it reads
# no advantages, so the policy-gradient invariants do not apply to it (core.checks keeps it off the actor)
REWARD_MODEL_LOSSES = frozenset({"implicit_prm"})


@POLICY_LOSSES.register("implicit_prm")
def implicit_prm(logprobs, batch, cfg, norm):
    """PRIME's implicit-PRM loss: cross-entropy of each sample's implicit outcome reward against its outcome label.

    z_i = beta * sum_t (logp_it - logp_ref_it) m_it (the implicit reward, beta = prm_beta); L = mean_i BCE(sigmoid(z_i),
    y_i) = mean_i [softplus(z_i) - y_i z_i] over the mini-batch's sequences, y_i = ``scores`` in [0, 1] (the verifier's
    outcome). Keys: ref_logprobs, scores, response_mask. ``logprobs`` are the reward model's (the ``prm`` role: a
    causal LM started from the SFT policy). Metrics: prm_acc (sign of z agrees with y > 0.5), implicit_reward_mean.
    Paper: Cui et al. 2025, "Process Reinforcement through Implicit Rewards" (arXiv:2502.01456), Eq. 4 (ce loss);
    verl's recipe/prime ``compute_ce_dpo_loss_rm`` (the same loss; here computed from logits, stable for large |z|).
    Example: beta 0.5, logp [[-1, -2]], ref [[-2, -2]], y = 1 -> z = 0.5, L = log(1 + e^0.5) - 0.5 = 0.4741; y = 0 ->
    0.9741; dL/dlogp_t = beta (sigmoid(z) - y) = 0.5 (0.6225 - 1) = -0.1888 per token.
    """
    batch.require("ref_logprobs", "scores", "response_mask")
    mask = batch["response_mask"].to(logprobs.dtype)
    y = batch["scores"].to(logprobs.dtype)
    if bool(((y < 0) | (y > 1)).any()):
        raise ValueError(f"implicit_prm: outcome labels (scores) must be in [0, 1], got {y.min():g} .. {y.max():g}")
    z = cfg.prm_beta * ((logprobs - batch["ref_logprobs"]) * mask).sum(-1)
    loss = seq_mean(torch.nn.functional.softplus(z) - y * z, norm)
    metrics = {"prm_acc": ((z > 0) == (y > 0.5)).to(z.dtype).mean(), "implicit_reward_mean": z.mean()}
    return loss, {k: v.detach() for k, v in metrics.items()}


def value_loss(vpreds: torch.Tensor, batch: Batch, clip: float, norm: LossNorm) -> tuple[torch.Tensor, dict]:
    """Clipped value loss: 0.5 * agg( max((V - G)^2, (clip(V, V_old - c, V_old + c) - G)^2) ).

    vpreds (B, T) new values; batch keys ``values`` (old), ``returns``, ``response_mask``.
    Paper: PPO2 baselines (Dhariwal et al. 2017); as in verl's ``compute_value_loss``.
    Example: V_old = 0, V = 1, G = 2, c = 0.5 -> max((1-2)^2, (0.5-2)^2) = 2.25 -> 1.125.
    """
    batch.require("values", "returns", "response_mask")
    mask = batch["response_mask"].to(vpreds.dtype)
    # V itself wherever it is within c of V_old, so l2 equals l1 bitwise there and vf_clipfrac counts only tokens the
    # clip changed (with V_old + clamp(V - V_old, -c, c) the Megatron and FSDP critics, values 7e-8 apart, disagreed on
    # one token's flag under AVX2: 0.241 vs 0.256; tests/train/test_megatron_critic.py)
    clipped = torch.clamp(vpreds, batch["values"] - clip, batch["values"] + clip)
    l1, l2 = (vpreds - batch["returns"]) ** 2, (clipped - batch["returns"]) ** 2
    loss = 0.5 * aggregate(torch.maximum(l1, l2), mask, norm)
    return loss, {"vf_clipfrac": masked_mean((l2 > l1).float(), mask).detach()}


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor, norm: LossNorm) -> torch.Tensor:
    """The aggregated entropy H = agg(entropy); the actor minimises pg_loss - entropy_coef * H.
    Example (token-mean): entropy [[1, 3]] -> 2.0."""
    return aggregate(entropy, mask.to(entropy.dtype), norm)


def positive_nll_loss(logprobs: torch.Tensor, batch: Batch, norm: LossNorm) -> torch.Tensor:
    """VAPO's positive-example LM loss: -agg(logp) over samples with ``scores`` > 0 only.

    L = -(1 / sum_{i in T} |o_i|) sum_{i in T} sum_t logp_it, T = correct samples; build ``norm`` with
    ``LossNorm.of(mask * positive[:, None])`` so the count covers positive tokens only. Added as mu * L.
    Paper: VAPO, Yue et al. 2025 (arXiv:2504.05118), Sec. 3.3.
    Example: scores [1, 0], logp [[-1, -3], [-5, -5]] -> -(-1 - 3) / 2 = 2.0.
    """
    batch.require("scores", "response_mask")
    pos = (batch["scores"] > 0).to(logprobs.dtype)[:, None] * batch["response_mask"].to(logprobs.dtype)
    return aggregate(-logprobs, pos, norm)
