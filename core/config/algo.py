"""The ``algo:`` section (``AlgoConfig``): sampling, advantages, rewards' handling, KL in the reward, validation
sampling -- and the policy-loss knobs the ``actor.loss`` section holds. Each field is commented once, here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from core.config.ranges import Count, NonNegative, PositiveFloat, PositiveInt, Unit, UnitOpen, check_fields


@dataclass(frozen=True)
class SamplingParams:
    # samples per prompt
    n: PositiveInt = 1
    # 0 = greedy
    temperature: NonNegative = 1.0
    # nucleus sampling mass (1 = off)
    top_p: UnitOpen = 1.0
    # keep the k most likely tokens (0 or -1 = off)
    top_k: int = -1
    # response length limit in tokens
    max_new_tokens: Count = 256
    # extra strings that end a response (EOS always does)
    stop: tuple[str, ...] = ()
    # seed of the sampling generator
    seed: int = 0
    # keep generating past EOS up to max_new_tokens (benchmarks: every sequence has the same length)
    ignore_eos: bool = False

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class AdvantageConfig:
    # estimator name, one of core.algos.ADVANTAGES
    estimator: str = "grpo"
    # discount factor
    gamma: Unit = 1.0
    # GAE lambda (for decoupled GAE: the actor's lambda)
    lam: Unit = 1.0
    # VAPO decoupled GAE: lambda for the critic's value targets
    lam_critic: Unit = 1.0
    # VAPO length-adaptive GAE: lambda_i = 1 - 1 / (alpha * length_i)
    length_alpha: float = 0.05
    # GRPO: divide by the group std (false = Dr.GRPO)
    norm_by_std: bool = True
    # added to the std before dividing
    epsilon: PositiveFloat = 1e-6
    # SPPO: temperature beta of the soft-mean baseline (0: its limit, the plain mean)
    sppo_beta: NonNegative = 1.0
    # GPG: normalising constant f_norm
    gpg_f_norm: float = 1.0
    # PRIME: weights of the implicit PRM's dense rewards and of the outcome, each leave-one-out (verl's
    # reward_dpo_coef, reward_gt_coef)
    prime_process_coef: float = 5.0
    prime_outcome_coef: float = 5.0
    # on-policy distillation (core.algos.distill): distill_mixed's weight of the reverse-KL term (1 - it: the
    # forward-KL term; GKD's beta)
    distill_beta: Unit = 0.5
    # distill_forward_kl (and distill_mixed): the cap on the teacher / student probability ratio of a token
    distill_ratio_cap: PositiveFloat = 10.0
    # any distill estimator: the weight of GRPO's outcome advantage added to the teacher's signal (0: none)
    distill_outcome_coef: NonNegative = 0.0

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class PolicyLossConfig:
    # loss name, one of core.algos.POLICY_LOSSES
    name: str = "vanilla"
    # PPO ratio clip: [1 - clip_low, 1 + clip_high] (DAPO clip-higher: 0.2 / 0.28)
    clip_low: NonNegative = 0.2
    clip_high: NonNegative = 0.2
    # dual-clip constant c (> 1) bounding the loss for negative advantages
    dual_clip_c: float = 3.0
    # Clip-Cov: fraction of tokens whose gradient is cut, and the covariance window they are drawn from
    clip_cov_ratio: Unit = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    # KL-Cov: fraction of highest-covariance tokens given a KL penalty, and its coefficient
    kl_cov_ratio: Unit = 0.0002
    kl_cov_coef: float = 1.0
    # CISPO: importance-weight clip [1 - low, 1 + high] (the paper leaves the lower side open)
    cispo_clip_low: NonNegative = 1.0
    cispo_clip_high: NonNegative = 0.28
    # SPPO: eta scaling the advantage target of the squared loss
    sppo_eta: float = 1.0
    # SAPO: temperatures of the soft gate for positive / negative advantages (verl: actor.tau_pos / tau_neg)
    sapo_tau_pos: PositiveFloat = 1.0
    sapo_tau_neg: PositiveFloat = 1.05
    # DRO: beta of the quadratic log-ratio penalty; must be > 0 with loss dro (verl's example: 0.05)
    dro_beta: NonNegative = 0.0
    # DPPO: trust-region bounds on the sampled token's probability change (dppo_tv: p - p_old; dppo_kl: the binary
    # KL) for negative / positive advantages (verl reads clip_ratio_low / high; its examples: 0.15 TV, 0.05 KL), and
    # the cap of the stop-gradient importance weight (verl: clip_ratio_c, 3)
    dppo_delta_low: NonNegative = 0.2
    dppo_delta_high: NonNegative = 0.2
    dppo_is_cap: NonNegative = 3.0
    # REINFORCE: importance weights pi / pi_old of each token ("token") or of the whole sequence ("sequence"), or
    # none (""), truncated at reinforce_is_cap (TIS)
    reinforce_is: str = "token"
    reinforce_is_cap: NonNegative = 2.0
    # implicit_prm (PRIME's reward-model loss, the prm role's; core.implicit_prm): beta of its implicit reward
    prm_beta: NonNegative = 0.05
    # mixed into Clip-Cov's random token choice (each call also draws from the process's torch RNG)
    seed: int = 0

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class KLInRewardConfig:
    # beta of KL(old || ref) subtracted from every token's reward (0 = off; needs a reference); the start value
    # when adaptive
    coef: NonNegative = 0.0
    # per-token KL estimator (core.algos.KL_KINDS)
    kind: str = "k1"
    # adapt beta toward target_kl over horizon samples (Ziegler et al. 2019); false = fixed beta
    adaptive: bool = False
    target_kl: PositiveFloat = 0.1
    horizon: PositiveFloat = 10000.0

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class PFPPOConfig:
    # PF-PPO policy filtration (Shen et al. 2024, arXiv:2409.06957): the updates train on a same-size resample of
    # the batch, with replacement, weighted by each sample's score (core.algos.pf_ppo_resample)
    enable: bool = False
    # pow (|score|^weight_pow), max_min (only the batch's best and worst), max_random (0.4 best, 0.1 the rest)
    method: str = "pow"
    weight_pow: float = 2.0

    def __post_init__(self):
        check_fields(self)
        if self.method not in ("pow", "max_min", "max_random"):
            raise ValueError(f"algo.pf_ppo.method must be pow, max_min or max_random, got {self.method!r}")


@dataclass(frozen=True)
class AlgoConfig:
    # generation: n samples per prompt, temperature, lengths
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # advantage estimator and its knobs
    adv: AdvantageConfig = field(default_factory=AdvantageConfig)
    # reward worker processes scoring in parallel (0 = one: every call runs in a worker process, so the per-call
    # limit holds wherever the call is) and the per-call limit
    reward_workers: Count = 0
    reward_timeout_s: PositiveFloat = 10.0
    # score given to a sample whose reward raises / times out / is NaN (None = fail the step)
    reward_fallback: float | None = None
    # with a reward model (use_reward_model): score = reward_function_weight x the reward function's score +
    # reward_model_weight x the reward model's, on the rows whose data_source is in reward_model_sources (all when
    # empty; the others keep the function's score alone). reward_function_weight 0: the reward model alone
    reward_function_weight: float = 1.0
    reward_model_weight: float = 1.0
    reward_model_sources: list[str] = field(default_factory=list)
    # a weight sync that takes longer fails the step (WorkerTimeoutError) instead of hanging on a stalled peer
    sync_timeout_s: PositiveFloat = 300.0
    # off-policy correction of the rollout engine's samples (core/algos/off_policy.py), on when tis_cap > 0: the
    # advantages scaled by per-token weights of r = pi_old / pi_rollout with cap C = tis_cap. tis (Yao et al. 2025):
    # min(r, C); masked_is (IcePop): r inside [1/C, C], else 0; seq_mask: r where the sequence's geometric-mean r is
    # inside [1/C, C], else the whole sequence 0
    tis_cap: NonNegative = 0.0
    off_policy_correction: Literal["tis", "masked_is", "seq_mask"] = "tis"
    # verl's bypass mode: old_logprobs are the rollout engine's (no separate old-log-prob pass); the loss's ratio is
    # then pi / pi_rollout (with loss reinforce: its truncated IS weights correct the engine's mismatch)
    bypass_mode: bool = False
    # PF-PPO resampling of the batch by score, after the advantages (verl: algorithm.use_pf_ppo / pf_ppo)
    pf_ppo: PFPPOConfig = field(default_factory=PFPPOConfig)
    # KL to the reference as a reward penalty with a fixed or adaptive coefficient (classic PPO-RLHF)
    kl_in_reward: KLInRewardConfig = field(default_factory=KLInRewardConfig)
    # held-out validation sampling: greedy, one sample by default (max_new_tokens 0 = the training value)
    val_sampling: SamplingParams = field(default_factory=lambda: SamplingParams(n=1, temperature=0.0,
                                                                                max_new_tokens=0))

    def __post_init__(self):
        check_fields(self)
