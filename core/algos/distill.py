"""On-policy distillation's advantage estimators (entries of ``core.algos.advantages.ADVANTAGES``).

The student samples its own responses; a frozen teacher (the ``teacher`` role, ``teacher.model``) scores every
sampled token, and the per-token gap between the two log-probs is the advantage: a dense signal at every position
instead of one outcome per response. The policy loss is the run's (PPO-clipped by default), so on the first
mini-batch (ratio 1) the update is the plain policy gradient of the divergence named by the estimator.

Keys: ``old_logprobs`` (B, T) the student's log-prob of each sampled token before the update (the trainer's, as the
PPO ratio's denominator), ``teacher_logprobs`` (B, T) the teacher's of the same tokens after the same prompt,
``response_mask`` (B, T); with ``distill_outcome_coef`` > 0 also GRPO's keys (``token_rewards``, ``uid``). Outputs are
(B, T), zero on masked tokens; returns = advantages (no critic). Discount 0: a token's advantage is its own
divergence term, not a sum over the tokens after it (Thinking Machines' choice; the sum adds variance for little).
"""

from __future__ import annotations

import torch

from core.algos.advantages import ADVANTAGES, grpo

# estimators that read the student's pre-update log-probs (``old_logprobs``) before the update, and the teacher's: a
# run with one of them needs a teacher (core.checks), and computes its old log-probs before the update (core.loop)
DISTILL_ESTIMATORS = frozenset({"distill_reverse_kl", "distill_forward_kl", "distill_mixed"})


def _gap(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(log pi_teacher - log pi_student) on each sampled token, and the mask as the log-probs' dtype."""
    batch.require("old_logprobs", "teacher_logprobs", "response_mask")
    mask = batch["response_mask"].to(batch["old_logprobs"].dtype)
    # where, not a product: a padded position's log-probs need not be finite
    gap = torch.where(mask > 0, batch["teacher_logprobs"] - batch["old_logprobs"], torch.zeros_like(mask))
    return gap, mask


def _with_outcome(adv: torch.Tensor, batch, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """Adds ``distill_outcome_coef`` x GRPO's group-normalised outcome advantage (verl's and ROLL's mixed mode: the
    teacher's dense signal beside a verifiable reward); 0 leaves the teacher's signal alone."""
    if cfg.distill_outcome_coef > 0:
        adv = adv + cfg.distill_outcome_coef * grpo(batch, cfg)[0]
    return adv, adv


def reverse_kl_advantage(gap: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A_t = log pi_T(y_t) - log pi_S(y_t): minus the sampled estimate of KL(pi_S || pi_T) at position t."""
    return gap * mask


def forward_kl_advantage(gap: torch.Tensor, mask: torch.Tensor, cap: float) -> torch.Tensor:
    """A_t = min(pi_T(y_t) / pi_S(y_t), cap) - 1: the importance-weighted forward-KL gradient on the student's token."""
    return (torch.exp(gap).clamp(max=cap) - 1.0) * mask


@ADVANTAGES.register("distill_reverse_kl")
def distill_reverse_kl(batch, cfg):
    """Per-token reverse KL of student to teacher on the student's own samples (mode-seeking).

    A_t = log pi_T(y_t | x, y_<t) - log pi_S(y_t | x, y_<t) on each valid token y_t the student sampled. With
    y_t ~ pi_S, E[-A_t] = KL(pi_S || pi_T) at that state, and the policy gradient E[A_t grad log pi_S(y_t)] is minus
    that KL's gradient: the student lowers what it says and the teacher would not, raises what both say.
    (+ ``distill_outcome_coef`` x GRPO's advantage.)
    Keys: old_logprobs, teacher_logprobs, response_mask (B, T). Returns = advantages.
    Papers: GKD, Agarwal et al. 2024 (arXiv:2306.13649; on-policy data, the divergence family); MiniLLM, Gu et al.
    2024 (arXiv:2306.08543; reverse KL); Thinking Machines' "On-Policy Distillation" (Lu et al. 2025) and Qwen3
    (arXiv:2505.09388): this per-token advantage with discount 0.
    Example: old = [[-1.0, -0.5]], teacher = [[-0.2, -2.0]], mask [[1, 1]] -> A = [[0.8, -1.5]].
    """
    gap, mask = _gap(batch)
    return _with_outcome(reverse_kl_advantage(gap, mask), batch, cfg)


@ADVANTAGES.register("distill_forward_kl")
def distill_forward_kl(batch, cfg):
    """Per-token forward KL of teacher to student, estimated on the student's samples (mode-covering).

    grad KL(pi_T || pi_S) = -sum_y pi_T(y) grad log pi_S(y) = -E_{y ~ pi_S}[w(y) grad log pi_S(y)] with
    w = pi_T / pi_S; E_{pi_S}[grad log pi_S] = 0, so the baseline 1 may be subtracted:
    A_t = min(exp(log pi_T(y_t) - log pi_S(y_t)), c) - 1, c = ``distill_ratio_cap`` (a truncated importance weight:
    bounded variance, biased where the teacher puts far more mass on a token than the student). Only tokens the
    student samples are corrected (GKD's full-vocabulary forward KL needs the teacher's whole distribution at every
    position, B x T x V). (+ ``distill_outcome_coef`` x GRPO's advantage.)
    Keys: old_logprobs, teacher_logprobs, response_mask (B, T). Returns = advantages.
    Paper: GKD, Agarwal et al. 2024 (arXiv:2306.13649): forward KL on student-generated sequences.
    Example: old = [[-1.0, -0.5]], teacher = [[-0.2, -2.0]], c = 10 -> w = [2.2255, 0.2231] ->
    A = [[1.2255, -0.7769]].
    """
    gap, mask = _gap(batch)
    return _with_outcome(forward_kl_advantage(gap, mask, cfg.distill_ratio_cap), batch, cfg)


@ADVANTAGES.register("distill_mixed")
def distill_mixed(batch, cfg):
    """A mixture of the two: A_t = beta A_t^reverse + (1 - beta) A_t^forward, beta = ``distill_beta``.

    GKD's generalised objective interpolates between forward KL (beta 0) and reverse KL (beta 1); this mixes the two
    estimators' gradients the same way (beta 1 = distill_reverse_kl, beta 0 = distill_forward_kl).
    (+ ``distill_outcome_coef`` x GRPO's advantage.)
    Keys: old_logprobs, teacher_logprobs, response_mask (B, T). Returns = advantages.
    Paper: GKD, Agarwal et al. 2024 (arXiv:2306.13649).
    Example: the entries' example with beta 0.5: 0.5 [[0.8, -1.5]] + 0.5 [[1.2255, -0.7769]] = [[1.0128, -1.1384]].
    """
    gap, mask = _gap(batch)
    adv = (cfg.distill_beta * reverse_kl_advantage(gap, mask)
           + (1 - cfg.distill_beta) * forward_kl_advantage(gap, mask, cfg.distill_ratio_cap))
    return _with_outcome(adv, batch, cfg)


def distill_metrics(batch) -> dict[str, float]:
    """With a teacher (``teacher_logprobs`` in the batch): the sampled reverse KL per token, mean over valid tokens of
    log pi_S - log pi_T (the distance the student closes; 0 when it says what the teacher would), and the teacher's
    mean log-prob of the student's tokens."""
    if "teacher_logprobs" not in batch:
        return {}
    gap, mask = _gap(batch)
    tokens = mask.sum().clamp(min=1)
    teacher = torch.where(mask > 0, batch["teacher_logprobs"], torch.zeros_like(mask))
    return {"distill/reverse_kl": float(-gap.sum() / tokens), "distill/teacher_logprob_mean": float(teacher.sum() / tokens)}
