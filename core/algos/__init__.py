"""The algorithm library: registries looked up by name from config, each entry documented with its math.

    ADVANTAGES[name](batch, cfg) -> (advantages, returns)
    OFF_POLICY[name](old_logprobs, rollout_logprobs, mask, cap) -> per-token weights on the advantages
    POLICY_LOSSES[name](logprobs, batch, cfg, norm) -> (loss, metrics)
    KL_KINDS[name](logprobs, ref_logprobs) -> per-token KL
    AGGREGATIONS[name](loss_mat, mask, norm) -> scalar
"""

from core.algos.advantages import (ADVANTAGES, compute_advantages, gae_scan, length_adaptive_lambda,
                                   reverse_linear_scan, value_targets_explained_variance)
from core.algos.distill import DISTILL_ESTIMATORS
from core.algos.aggregate import AGGREGATIONS, LossNorm, aggregate, seq_mean
from core.algos.filters import groups_with_variance, overlong_penalty, pf_ppo_resample
from core.algos.kl import (KL_KINDS, AdaptiveKLController, FixedKLController, apply_kl_reward_penalty,
                           kl_loss, kl_penalty)
from core.algos.losses import POLICY_LOSSES, entropy_bonus, positive_nll_loss, value_loss
from core.algos.ops import (group_ids, group_stats, masked_mean, masked_var, masked_whiten,
                            scores_to_token_rewards)
from core.algos.off_policy import OFF_POLICY

__all__ = [
    "ADVANTAGES", "AGGREGATIONS", "DISTILL_ESTIMATORS", "KL_KINDS", "OFF_POLICY", "POLICY_LOSSES", "AdaptiveKLController",
    "FixedKLController", "LossNorm", "aggregate", "apply_kl_reward_penalty",
    "compute_advantages", "entropy_bonus", "gae_scan", "group_ids", "group_stats", "groups_with_variance",
    "kl_loss", "kl_penalty", "length_adaptive_lambda", "masked_mean", "masked_var", "masked_whiten", "overlong_penalty", "pf_ppo_resample",
    "positive_nll_loss", "reverse_linear_scan", "scores_to_token_rewards", "seq_mean", "value_loss", "value_targets_explained_variance",
]
