"""Advantage estimators. Signature: ``fn(batch, cfg: AdvantageConfig) -> (advantages, returns)``, both (B, T).

Inputs are batch keys (see ``core.protocol``): ``token_rewards`` (B, T) with the outcome at the last valid
token, ``response_mask`` (B, T), ``uid`` (B,) group ids, and where needed ``values`` (B, T) or
``reward_baselines`` (B,). Outputs are zero on masked tokens, also inside a gapped mask (tool output mid-response),
across which returns and GAE reach the valid tokens before it undecayed. Conventions follow verl's ``core_algos``.
"""

from __future__ import annotations

from typing import Callable

import torch

from core.config import AdvantageConfig
from core.algos.ops import group_ids, group_stats, masked_mean, masked_whiten, scores_to_token_rewards
from core.algos.registry import Registry
from core.protocol import Batch

AdvFn = Callable[[Batch, AdvantageConfig], tuple[torch.Tensor, torch.Tensor]]
ADVANTAGES: Registry[AdvFn] = Registry("advantage estimator", ("batch", "cfg"))


def compute_advantages(batch: Batch, cfg: AdvantageConfig) -> tuple[torch.Tensor, torch.Tensor]:
    return ADVANTAGES[cfg.estimator](batch, cfg)


def _outcome(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    batch.require("token_rewards", "response_mask")
    mask = batch["response_mask"].to(batch["token_rewards"].dtype)
    return (batch["token_rewards"] * mask).sum(-1), mask


def _scan_time_major(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """y_t = a_t + b_t * y_{t+1}, y_T = 0, on contiguous (T, B): one fused multiply-add per time step."""
    y = torch.empty_like(a)
    nxt = torch.zeros_like(a[0])
    for t in range(a.shape[0] - 1, -1, -1):
        nxt = torch.addcmul(a[t], b[t], nxt, out=y[t])
    return y


def _next(x: torch.Tensor) -> torch.Tensor:
    """Time-major x[t + 1] at row t; the last row is 0."""
    return torch.cat([x[1:], torch.zeros_like(x[:1])])


def reverse_linear_scan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """y_t = a_t + b_t * y_{t+1} with y_T = 0 for (B, T) inputs: returns, GAE and pass-through are all this.

    Vectorised over the batch; the loop is over time only, on time-major contiguous copies (a column of a
    row-major (B, T) tensor is strided, which is several times slower per step)."""
    return _scan_time_major(a.T.contiguous(), b.T.contiguous()).T.contiguous()


def gae_scan(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
             lam: float | torch.Tensor) -> torch.Tensor:
    """Generalised advantage estimation (vectorised over the batch, two reverse scans over time).

    delta_t = r_t + gamma * V_next(t) - V_t with V_next(t) the value at the next *valid* position (0 after the
    last); A_t = delta_t + gamma * lam * A_next. Masked positions (tool output inside a multi-turn response) are
    skipped: they pass A and V through unchanged, as in verl. ``lam``: a float or a (B,) per-sequence tensor."""
    r, v = rewards.T.contiguous(), values.T.contiguous()  # time-major (T, B)
    m = (mask.T > 0).to(r.dtype).contiguous()
    lam = torch.as_tensor(lam, dtype=r.dtype).reshape(1, -1)
    next_v = _scan_time_major(_next(m * v), _next(1 - m))
    delta = r + gamma * next_v - v
    adv = _scan_time_major(m * delta, torch.where(m > 0, gamma * lam, torch.ones_like(m)))
    return adv.T.contiguous()


# the estimators that read batch["values"]: a run with one of them needs a critic (core.checks)
VALUE_ESTIMATORS = frozenset({"gae", "decoupled_gae", "length_adaptive_gae"})
# estimators that read ``reward_baselines``: core's step scores each prompt's greedy response for them
BASELINE_ESTIMATORS = frozenset({"remax"})


@ADVANTAGES.register("gae")
def gae(batch, cfg):
    """PPO's GAE: advantages whitened over the batch, returns = raw advantages + values.

    A_t = sum_k (gamma*lam)^k delta_{t+k}, delta_t = r_t + gamma V_{t+1} - V_t; returns = A + V; then
    A <- (A - mean) / sqrt(var + 1e-8) over valid tokens (unbiased var). Keys: token_rewards, values, response_mask.
    Paper: Schulman et al. 2016, "High-Dimensional Continuous Control Using GAE" (arXiv:1506.02438).
    Example (gamma = lam = 1): r = [[0, 1]], V = [[0.5, 0.25]] -> delta = [-0.25, 0.75], raw A = [[0.5, 0.75]],
    returns = [[1, 1]]; whitened A = [[-0.7071, 0.7071]] (mean 0.625, unbiased var 0.03125).
    """
    batch.require("values")
    _, mask = _outcome(batch)
    raw = gae_scan(batch["token_rewards"], batch["values"], mask, cfg.gamma, cfg.lam)
    returns = (raw + batch["values"]) * mask
    return masked_whiten(raw, mask) * mask, returns


def _decoupled(batch: Batch, cfg: AdvantageConfig, lam_actor: float | torch.Tensor):
    batch.require("values")
    _, mask = _outcome(batch)
    rewards, values = batch["token_rewards"], batch["values"]
    returns = (gae_scan(rewards, values, mask, cfg.gamma, cfg.lam_critic) + values) * mask
    raw = gae_scan(rewards, values, mask, cfg.gamma, lam_actor)
    return masked_whiten(raw, mask) * mask, returns


@ADVANTAGES.register("decoupled_gae")
def decoupled_gae(batch, cfg):
    """VAPO's decoupled GAE: value targets with lam_critic, advantages with the actor's lam.

    returns = GAE(lam_critic) + V  (VAPO: lam_critic = 1, so value targets carry the outcome undecayed over
    long responses);  A = whiten(GAE(lam)). Keys: token_rewards, values, response_mask.
    Paper: VAPO, Yue et al. 2025 (arXiv:2504.05118), Sec. 3.1.
    Example (gamma = 1): r = [[0, 1]], V = [[0.5, 0.25]], lam_critic = 1 -> returns = [[1, 1]];
    lam = 0 -> raw A = delta = [[-0.25, 0.75]] -> whitened [[-0.7071, 0.7071]].
    """
    return _decoupled(batch, cfg, cfg.lam)


@ADVANTAGES.register("length_adaptive_gae")
def length_adaptive_gae(batch, cfg):
    """VAPO's length-adaptive GAE (decoupled): each sequence's actor lambda depends on its length.

    lam_i = 1 - 1 / (alpha * len_i), clamped to [0, 1] (alpha = length_alpha, VAPO: 0.05), so the TD-error sum
    neither vanishes on long responses nor is dominated by bias on short ones; value targets use lam_critic.
    Keys: token_rewards, values, response_mask.
    Paper: VAPO, Yue et al. 2025 (arXiv:2504.05118), Sec. 3.2.
    Example: alpha = 0.05, lengths [40, 200] -> lam = [1 - 1/2, 1 - 1/10] = [0.5, 0.9].
    """
    _, mask = _outcome(batch)
    return _decoupled(batch, cfg, length_adaptive_lambda(mask, cfg.length_alpha))


def length_adaptive_lambda(mask: torch.Tensor, alpha: float) -> torch.Tensor:
    """VAPO's per-response actor lambda (B,): 1 - 1 / (alpha * l_i), l_i the valid tokens of (B, T) ``mask``,
    clamped to [0, 1]: responses of at most 1 / alpha tokens get 0 (one-step TD), where the formula goes negative.
    Example: alpha = 0.05, lengths [10, 40, 200] -> [0, 0.5, 0.9]."""
    return (1.0 - 1.0 / (alpha * mask.sum(-1).clamp(min=1))).clamp(0.0, 1.0)


@ADVANTAGES.register("grpo")
def grpo(batch, cfg):
    """Group-relative outcome advantage, broadcast to every valid token.

    A_i = (R_i - mean_g(R)) / (std_g(R) + eps) over the n samples of prompt group g (unbiased std, eps = 1e-6);
    ``norm_by_std=False`` gives A_i = R_i - mean_g(R) (Dr.GRPO). A group of one has mean 0, std 1.
    Keys: token_rewards, response_mask, uid. Returns = advantages.
    Paper: DeepSeekMath / GRPO, Shao et al. 2024 (arXiv:2402.03300); Dr.GRPO, Liu et al. 2025 (arXiv:2503.20783).
    Example: one group R = [1, 0, 0] -> mean 1/3, std 0.5774 -> A = [1.1547, -0.5774, -0.5774].
    """
    batch.require("uid")
    scores, mask = _outcome(batch)
    mean, std, _ = group_stats(scores, group_ids(batch["uid"]))
    adv = (scores - mean) / (std + cfg.epsilon) if cfg.norm_by_std else scores - mean
    adv = adv[:, None] * mask
    return adv, adv


@ADVANTAGES.register("rloo")
def rloo(batch, cfg):
    """REINFORCE leave-one-out: each sample's baseline is the mean of the *other* samples of its group.

    A_i = R_i - mean_{j != i} R_j = n/(n-1) * (R_i - mean_g R); a group of one keeps A_i = R_i.
    Keys: token_rewards, response_mask, uid. Returns = advantages.
    Paper: Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE..." (arXiv:2402.14740).
    Example: R = [1, 0, 0] -> A = [1 - 0, 0 - 0.5, 0 - 0.5] = [1, -0.5, -0.5].
    """
    batch.require("uid")
    scores, mask = _outcome(batch)
    mean, _, n = group_stats(scores, group_ids(batch["uid"]))
    adv = torch.where(n > 1, (scores - mean) * n / (n - 1).clamp(min=1), scores)
    adv = adv[:, None] * mask
    return adv, adv


@ADVANTAGES.register("reinforce_plus_plus")
def reinforce_plus_plus(batch, cfg):
    """REINFORCE++: discounted return-to-go per token, whitened over the batch.

    G_t = r_t + gamma * G_{t+1} (reset after the last valid token; masked tokens inside a multi-turn response --
    tool output -- pass G through, as in ``gae_scan``); A = whiten(G) over valid tokens.
    Keys: token_rewards, response_mask. Returns = G on valid tokens, 0 on masked ones.
    Paper: Hu 2025, "REINFORCE++" (arXiv:2501.03262).
    Example (gamma = 1): r = [[0, 1], [0, 0]] -> G = [[1, 1], [0, 0]] -> A = [[0.866, 0.866], [-0.866, -0.866]].
    """
    _, mask = _outcome(batch)
    # G_t = m_t r_t + (gamma if m_t else 1) G_{t+1}: no reward after the last valid token, so G is 0 there
    m = mask.T.contiguous()
    step = torch.where(m > 0, torch.full_like(m, cfg.gamma), torch.ones_like(m))
    ret = _scan_time_major(batch["token_rewards"].T * m, step).T.contiguous() * mask  # G passed through a gap: 0 there
    return masked_whiten(ret, mask) * mask, ret


@ADVANTAGES.register("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline(batch, cfg):
    """REINFORCE++ with a group-mean baseline, then whitened over the batch.

    A = whiten((R_i - mean_g R) broadcast over valid tokens); a group of one has mean 0.
    Keys: token_rewards, response_mask, uid. Returns = advantages.
    Paper: Hu 2025, "REINFORCE++" (arXiv:2501.03262), the baseline variant.
    Example: groups {1, 0} and {1, 1}, one token each -> centred [0.5, -0.5, 0, 0] -> whitened
    [1.2247, -1.2247, 0, 0] (unbiased var 1/6).
    """
    batch.require("uid")
    scores, mask = _outcome(batch)
    mean, _, _ = group_stats(scores, group_ids(batch["uid"]))
    adv = (scores - mean)[:, None] * mask
    adv = masked_whiten(adv, mask) * mask
    return adv, adv


@ADVANTAGES.register("remax")
def remax(batch, cfg):
    """ReMax: return-to-go minus the reward of the greedy response to the same prompt; no whitening.

    G_t = sum_{k >= t} r_k;  A_t = G_t - b_i with b_i the greedy sample's reward (key ``reward_baselines`` (B,)).
    Keys: token_rewards, response_mask, reward_baselines. Returns = G on valid tokens, 0 on masked ones.
    Paper: Li et al. 2024, "ReMax" (arXiv:2310.10505).
    Example: r = [[0, 1]], b = [0.25] -> G = [[1, 1]], A = [[0.75, 0.75]].
    """
    batch.require("reward_baselines")
    _, mask = _outcome(batch)
    ret = (batch["token_rewards"] * mask).flip(-1).cumsum(-1).flip(-1) * mask  # the sum runs on through a gap: 0 there
    return (ret - batch["reward_baselines"][:, None]) * mask, ret


@ADVANTAGES.register("opo")
def opo(batch, cfg):
    """On-Policy RL with Optimal reward baseline: a length-weighted group mean as baseline.

    b_g = sum_j len_j R_j / sum_j len_j over the group; A_i = R_i - b_g (a group of one: b = 0).
    Keys: token_rewards, response_mask, uid. Returns = advantages.
    Paper: Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline" (arXiv:2505.23585).
    Example: R = [1, 0], lengths [1, 3] -> b = 1/4 -> A = [0.75, -0.25].
    """
    batch.require("uid")
    scores, mask = _outcome(batch)
    gid, length = group_ids(batch["uid"]), mask.sum(-1)
    num, _, n = group_stats(scores * length, gid)
    den, _, _ = group_stats(length, gid)
    baseline = torch.where(n > 1, num / den.clamp(min=1e-8), torch.zeros_like(scores))
    adv = (scores - baseline)[:, None] * mask
    return adv, adv


@ADVANTAGES.register("gpg")
def gpg(batch, cfg):
    """Group Policy Gradient: group-centred reward, rescaled by the share of samples with a non-zero reward.

    alpha = B / max(1, #{i: R_i != 0});  A_i = alpha * (R_i - mean_g R) / f_norm (a group of one: mean 0).
    Keys: token_rewards, response_mask, uid. Returns = advantages.
    Paper: Chu et al. 2025, "GPG: A Simple and Strong RL Baseline" (arXiv:2504.02546).
    Example: one group R = [1, 0, 0, 0] -> alpha = 4, mean 0.25 -> A = [3, -1, -1, -1].
    """
    batch.require("uid")
    scores, mask = _outcome(batch)
    mean, _, _ = group_stats(scores, group_ids(batch["uid"]))
    alpha = len(scores) / max(1, int(torch.count_nonzero(scores)))
    adv = (alpha * (scores - mean) / cfg.gpg_f_norm)[:, None] * mask
    return adv, adv


@ADVANTAGES.register("grpo_passk")
def grpo_passk(batch, cfg):
    """Pass@k training: only the best sample of each group gets a (positive) advantage.

    A_best = (R_max - R_second) / (std_g + eps) (without ``norm_by_std``: R_max - R_second); all others 0.
    Ties go to the lowest row. Groups need >= 2 samples. Keys: token_rewards, response_mask, uid.
    Paper: Chen et al. 2025, "Pass@k Training for Adaptively Balancing Exploration and Exploitation" (arXiv:2508.10751).
    Example: R = [0, 1, 0] -> best row 1, std 0.5774 -> A = [0, 1.7320, 0].
    """
    batch.require("uid")
    scores, mask = _outcome(batch)
    gid = group_ids(batch["uid"])
    _, std, n = group_stats(scores, gid)
    if bool((n < 2).any()):
        lone = batch["uid"][int(torch.nonzero(n < 2)[0])]
        raise ValueError(f"grpo_passk needs >= 2 samples per group; group uid={lone!r} has 1")
    order = torch.argsort(-scores, stable=True)
    order = order[torch.argsort(gid[order], stable=True)]  # grouped, best first, ties by row
    starts = torch.cumsum(torch.bincount(gid), 0) - torch.bincount(gid)
    best, second = order[starts], order[starts + 1]
    gap = scores[best] - scores[second]
    adv = torch.zeros_like(scores)
    adv[best] = gap / (std[best] + cfg.epsilon) if cfg.norm_by_std else gap
    adv = adv[:, None] * mask
    return adv, adv


@ADVANTAGES.register("sppo")
def sppo(batch, cfg):
    """SPPO: reward minus the batch's soft-mean (log-partition) baseline, per sequence.

    A_i = R_i - (1/beta) log( (1/B) sum_j exp(beta R_j) )   (beta -> 0: the plain mean). Keys: token_rewards,
    response_mask. Returns = advantages.
    Paper: Wu et al. 2024, "Self-Play Preference Optimization" (arXiv:2405.00675).
    Example: beta = 1, R = [1, 0] -> baseline log((e + 1) / 2) = 0.6201 -> A = [0.3799, -0.6201].
    """
    scores, mask = _outcome(batch)
    if cfg.sppo_beta == 0:
        base = scores.mean()
    else:
        n = torch.tensor(float(len(scores)), dtype=scores.dtype)
        base = (torch.logsumexp(cfg.sppo_beta * scores, 0) - n.log()) / cfg.sppo_beta
    adv = (scores - base)[:, None] * mask
    return adv, adv


def _leave_one_out(rewards: torch.Tensor, mask: torch.Tensor, gid: torch.Tensor) -> torch.Tensor:
    """verl's ``masked_rloo``: with m_i each sample's mean over its valid positions and S the group's sum of them,
    every valid entry r of sample i becomes (n r - S) / (n - 1) = r - mean_{j != i} m_j + (r - m_i) / (n - 1); a group
    of one keeps r. Zero off the mask."""
    m = masked_mean(rewards, mask, -1)
    total = torch.zeros(int(gid.max()) + 1, dtype=m.dtype).index_add_(0, gid, m)[gid][:, None]
    n = torch.bincount(gid).to(m.dtype)[gid][:, None]
    return torch.where(n > 1, (n * rewards - total) / (n - 1).clamp(min=1), rewards) * mask


@ADVANTAGES.register("prime")
def prime(batch, cfg):
    """PRIME: leave-one-out baselines on the implicit PRM's dense rewards and on the outcome, summed, then returns.

    R_t = c_p LOO(r^prm)_t + c_o LOO(r^o)_t, LOO as verl's ``masked_rloo`` (``_leave_one_out``: dense rewards against
    the other samples' per-token means; the outcome, on the last valid token, leave-one-out exactly); returns
    G_t = sum_{s >= t} gamma^(s-t) R_s over valid tokens (a masked gap, tool output, is no step); A = whiten(G).
    c_p = prime_process_coef, c_o = prime_outcome_coef (verl: reward_dpo_coef, reward_gt_coef, both 5). Keys: process_rewards (B, T: the implicit
    PRM's, ``core.implicit_prm``), token_rewards, response_mask, uid.
    Paper: Cui et al. 2025, "Process Reinforcement through Implicit Rewards" (arXiv:2502.01456), Eq. 5-6; as verl's
    recipe/prime ``compute_rloo_advantage_return`` (whose dense baseline adds (r - m_i) / (n - 1) to the paper's).
    Example (c_p = c_o = 1, gamma 1, one group of 2): r^prm = [[0.2, 0.4], [0, 0.2]] -> m = [0.3, 0.1], LOO =
    [[0, 0.4], [-0.4, 0]]; outcome [1, 0] -> [1, -1] on the last token; R = [[0, 1.4], [-0.4, -1]], G = [[1.4, 1.4],
    [-1.4, -1]], A = (G - 0.1) / 1.5100 = [[0.8609, 0.8609], [-0.9934, -0.7285]].
    """
    batch.require("process_rewards", "uid")
    outcome, mask = _outcome(batch)
    gid = group_ids(batch["uid"])
    last = scores_to_token_rewards(torch.ones_like(outcome), mask)
    total = (cfg.prime_process_coef * _leave_one_out(batch["process_rewards"].to(mask.dtype), mask, gid)
             + cfg.prime_outcome_coef * _leave_one_out(outcome[:, None] * last, last, gid))
    step = torch.where(mask > 0, torch.full_like(total, cfg.gamma), torch.ones_like(total))  # a gap is no step
    returns = reverse_linear_scan(total * mask, step) * mask
    return masked_whiten(returns, mask) * mask, returns


def value_targets_explained_variance(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over valid tokens (how well the critic predicts); NaN when the
    returns do not vary (every sample scored the same: nothing to explain, and dividing by ~0 gave -8e5)."""
    var_r = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    if float(var_r) < 1e-8:
        return float("nan")
    resid = returns - values
    var_e = masked_mean((resid - masked_mean(resid, mask)) ** 2, mask)
    return float(1 - var_e / var_r)
