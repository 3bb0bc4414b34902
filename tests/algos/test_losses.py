"""Every policy loss, the value loss, entropy bonus and NLL term against values computed by hand."""

import math

import pytest
import torch

from core.config import PolicyLossConfig
from core.algos import AGGREGATIONS, POLICY_LOSSES, LossNorm, entropy_bonus, positive_nll_loss, value_loss
from core.protocol import Batch

C = PolicyLossConfig()


def run(name, log_ratio, adv, mask=None, cfg=C, logp=None, mode="token-mean"):
    log_ratio = torch.as_tensor(log_ratio, dtype=torch.float64)
    logp = torch.as_tensor(logp, dtype=torch.float64) if logp is not None else torch.full_like(log_ratio, -1.0)
    mask = torch.ones_like(log_ratio) if mask is None else torch.as_tensor(mask, dtype=torch.float64)
    b = Batch({"old_logprobs": logp - log_ratio, "advantages": torch.as_tensor(adv, dtype=torch.float64).expand_as(log_ratio),
               "response_mask": mask})
    return POLICY_LOSSES[name](logp.clone().requires_grad_(True), b, cfg, LossNorm.of(mask, mode))


def test_vanilla_clip_and_dual_clip():
    # per token (eps 0.2, c 3): A=1,r=1.5 -> -1.2 | A=-1,r=5 -> 3 (dual clip) | A=1,r=1 -> -1 | A=-1,r=0.5 -> 0.8
    loss, m = run("vanilla", [[math.log(1.5), math.log(5.0), 0.0, math.log(0.5)]], [[1.0, -1.0, 1.0, -1.0]])
    assert loss.item() == pytest.approx((-1.2 + 3 - 1 + 0.8) / 4)
    # clipfrac counts tokens where the clipped term wins (tokens 1 and 4); token 2 is the dual clip's
    assert m["pg_clipfrac"].item() == pytest.approx(2 / 4)
    assert m["pg_clipfrac_lower"].item() == pytest.approx(1 / 4)
    with pytest.raises(ValueError, match="dual_clip_c"):
        run("vanilla", [[0.0]], [[1.0]], cfg=PolicyLossConfig(dual_clip_c=1.0))


def test_vanilla_clip_higher_is_asymmetric():
    cfg = PolicyLossConfig(clip_low=0.2, clip_high=0.28)
    loss, _ = run("vanilla", [[math.log(1.5)]], [[1.0]], cfg=cfg)
    assert loss.item() == pytest.approx(-1.28)
    loss, _ = run("vanilla", [[math.log(0.5)]], [[-1.0]], cfg=cfg)
    assert loss.item() == pytest.approx(0.8)


def test_log_ratio_is_clamped_at_20():
    loss, _ = run("vanilla", [[50.0]], [[-1e-3]], cfg=PolicyLossConfig(dual_clip_c=1e12))
    assert loss.item() == pytest.approx(1e-3 * math.exp(20), rel=1e-9)


def test_gspo_sequence_ratio():
    loss, m = run("gspo", [[0.1, 0.3]], [[1.0, 1.0]])
    assert loss.item() == pytest.approx(-1.2)  # exp(0.2) = 1.2214 clipped to 1.2 on both tokens
    loss, _ = run("gspo", [[0.1, 0.05]], [[1.0, 1.0]])
    assert loss.item() == pytest.approx(-math.exp(0.075))


def test_clip_cov_cuts_one_token_in_the_covariance_window():
    # 4 tokens; cov uses A and logp: A = [2, -2, 0, 0], logp = [-1, -3, -2, -2] -> means 0, -2
    # cov = [2*1, -2*-1, 0, 0] = [2, 2, 0, 0]: tokens 0 and 1 are in the (1, 5) window; ratio 1 cuts exactly 1
    cfg = PolicyLossConfig(clip_cov_ratio=0.25)
    loss, m = run("clip_cov", [[0.0] * 4], [[2.0, -2.0, 0.0, 0.0]], cfg=cfg, logp=[[-1.0, -3.0, -2.0, -2.0]])
    assert m["pg_clipfrac"].item() == pytest.approx(0.25)
    assert loss.item() in (pytest.approx(2 / 4), pytest.approx(-2 / 4))  # one of -A*1 = [-2, 2] survives
    none, m0 = run("clip_cov", [[0.0] * 4], [[2.0, -2.0, 0.0, 0.0]], logp=[[-1.0, -3.0, -2.0, -2.0]],
                   cfg=PolicyLossConfig(clip_cov_lb=5.0, clip_cov_ub=6.0))
    assert m0["pg_clipfrac"].item() == 0 and none.item() == pytest.approx(0.0)


def test_kl_cov_penalises_the_top_covariance_token():
    cfg = PolicyLossConfig(kl_cov_ratio=0.34, kl_cov_coef=1.0)  # floor(3 * 0.34) = 1 token
    loss, _ = run("kl_cov", [[0.5, 0.0, 0.0]], [[2.0, 1.0, -1.0]], cfg=cfg, logp=[[-0.5, -2.0, -2.0]])
    assert loss.item() == pytest.approx((-2 * math.exp(0.5) + 0.5 - 1 + 1) / 3)


def test_gpg():
    loss, _ = run("gpg", [[0.3, -0.2]], [[2.0, -1.0]], logp=[[-0.5, -1.0]])
    assert loss.item() == pytest.approx(0.0)
    loss, _ = run("gpg", [[0.0]], [[2.0]], logp=[[-0.5]])
    assert loss.item() == pytest.approx(1.0)


def test_geo_mean():
    loss, m = run("geo_mean", [[0.1, 0.5]], [[1.0, 1.0]])
    assert loss.item() == pytest.approx(-math.exp(0.15), abs=1e-6)
    assert m["pg_clipfrac"].item() == pytest.approx(0.5)
    # negative advantage: the lower side is clipped at -0.2 (the max of sgn*d and sgn*clip(d))
    loss, _ = run("geo_mean", [[-0.5, 0.1]], [[-1.0, -1.0]])
    assert loss.item() == pytest.approx(math.exp((-0.2 + 0.1) / 2), abs=1e-6)


def test_cispo():
    loss, m = run("cispo", [[math.log(1.5)]], [[1.0]], logp=[[-0.5]])
    assert loss.item() == pytest.approx(0.64)
    assert m["pg_clipfrac"].item() == 1.0


def test_sppo_squared_loss():
    loss, _ = run("sppo", [[0.1, 0.2]], [[0.5, 0.5]])
    assert loss.item() == pytest.approx(0.04)
    loss, _ = run("sppo", [[0.1, 0.2], [0.0, 0.0]], [[0.5, 0.5], [-1.0, -1.0]], cfg=PolicyLossConfig(sppo_eta=2.0))
    assert loss.item() == pytest.approx(((0.3 - 1.0) ** 2 + (0 + 2.0) ** 2) / 2)


def test_value_loss_clipped():
    mask = torch.ones(1, 2, dtype=torch.float64)
    b = Batch({"values": torch.zeros(1, 2, dtype=torch.float64), "returns": torch.tensor([[2.0, 0.2]], dtype=torch.float64),
               "response_mask": mask})
    loss, m = value_loss(torch.tensor([[1.0, 0.1]], dtype=torch.float64), b, 0.5, LossNorm.of(mask))
    # token 1: max(1, 2.25) = 2.25; token 2: max(0.01, 0.01) = 0.01 -> 0.5 * mean = 0.565
    assert loss.item() == pytest.approx(0.5 * (2.25 + 0.01) / 2)
    assert m["vf_clipfrac"].item() == pytest.approx(0.5)


def test_entropy_bonus_and_positive_nll():
    mask = torch.ones(1, 2)
    assert entropy_bonus(torch.tensor([[1.0, 3.0]]), mask, LossNorm.of(mask)).item() == pytest.approx(2.0)
    logp = torch.tensor([[-1.0, -3.0], [-5.0, -5.0]])
    b = Batch({"scores": torch.tensor([1.0, 0.0]), "response_mask": torch.ones(2, 2)})
    pos_mask = b["response_mask"] * (b["scores"] > 0)[:, None]
    assert positive_nll_loss(logp, b, LossNorm.of(pos_mask)).item() == pytest.approx(2.0)


@pytest.mark.parametrize("mode,expected", [("token-mean", 2.0), ("seq-mean-token-mean", 2.25),
                                           ("seq-mean-token-sum", 3.0), ("seq-mean-token-sum-norm", 1.5)])
def test_aggregations_hand_computed(mode, expected):
    loss, mask = torch.tensor([[1.0, 2.0], [3.0, 0.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    assert AGGREGATIONS[mode](loss, mask, LossNorm.of(mask, mode)).item() == pytest.approx(expected)


def test_missing_batch_key_is_named():
    b = Batch({"old_logprobs": torch.zeros(1, 2), "response_mask": torch.ones(1, 2)})
    with pytest.raises(KeyError, match=r"missing key\(s\) \['advantages'\]"):
        POLICY_LOSSES["vanilla"](torch.zeros(1, 2), b, C, LossNorm())


def test_registry_enforces_one_signature_and_docstrings():
    with pytest.raises(TypeError, match="takes exactly"):
        @POLICY_LOSSES.register("bad")
        def bad(logprobs, batch, cfg):
            """doc"""
    with pytest.raises(TypeError, match="docstring"):
        @POLICY_LOSSES.register("bad2")
        def bad2(logprobs, batch, cfg, norm):
            pass


def test_clip_cov_draws_anew_each_call_and_replays_under_the_same_rng_state():
    """Eight equal candidates, one cut per call: a fixed seed cut the same token in every micro-batch of every step;
    now the pick follows the process's torch RNG (seeded at start, checkpointed), so it varies and replays."""
    cfg = PolicyLossConfig(clip_cov_ratio=0.125, clip_cov_lb=0.5, clip_cov_ub=5.0)
    args = ("clip_cov", [[0.0] * 8], [[2.0, 2.0, 2.0, 2.0, -2.0, -2.0, -2.0, -2.0]])
    logp = [[-1.0] * 4 + [-3.0] * 4]                                        # cov = (A - 0)(logp + 2) = 2 for all

    def cut_positions(n):
        out = []
        for _ in range(n):
            loss, _ = run(*args, cfg=cfg, logp=logp)
            out.append(round(loss.item(), 6))
        return out

    torch.manual_seed(0)
    first = cut_positions(12)
    torch.manual_seed(0)
    assert cut_positions(12) == first                                        # reproducible from the RNG state
    assert len(set(first)) > 1                                               # not the same cut every call


def test_positive_nll_flows_only_through_correct_rows_and_is_zero_without_them():
    logp = torch.tensor([[-1.0, -3.0], [-5.0, -5.0], [-2.0, -4.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    b = Batch({"scores": torch.tensor([1.0, 0.0, 1.0]), "response_mask": mask})
    pos = mask * (b["scores"] > 0)[:, None]
    loss = positive_nll_loss(logp, b, LossNorm.of(pos))
    assert loss.item() == pytest.approx((1 + 3 + 2) / 3)      # 3 correct tokens: rows 0 and 2 (its first token)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1 / 3, -1 / 3], [0.0, 0.0], [-1 / 3, 0.0]]))
    none = Batch({"scores": torch.tensor([0.0, -1.0, 0.0]), "response_mask": mask})
    zero = positive_nll_loss(logp, none, LossNorm.of(mask * 0))
    assert zero.item() == 0.0 and torch.autograd.grad(zero, logp)[0].abs().sum() == 0


def test_value_clipfrac_counts_clipped_tokens_only_not_rounding():
    """Values that all stay within the clip range are never clipped: vf_clipfrac is 0 and the loss is the unclipped
    one, bitwise (the clipped branch is V itself there)."""
    import torch

    from core.algos import LossNorm, value_loss
    from core.protocol import Batch

    g = torch.Generator().manual_seed(0)
    old = torch.randn(64, 16, generator=g)
    new = old + (torch.rand(64, 16, generator=g) - 0.5) * 0.3          # within 0.15 of the old values
    b = Batch({"values": old, "returns": torch.randn(64, 16, generator=g), "response_mask": torch.ones(64, 16)})
    loss, m = value_loss(new, b, 0.2, LossNorm("token-mean", 64 * 16, 64, 1, 16.0))
    assert float(m["vf_clipfrac"]) == 0.0
    assert float(loss) == float(0.5 * ((new - b["returns"]) ** 2).mean())


def test_sapo_soft_gate_and_its_gradient():
    """l = -A (4 / tau) sigmoid(tau (r - 1)); d l / d logp = -A 4 s (1 - s) r: at r = 1 the policy gradient -A."""
    sig = 1 / (1 + math.exp(-(math.exp(0.5) - 1)))
    loss, _ = run("sapo", [[0.5]], [[1.0]])
    assert loss.item() == pytest.approx(-4 * sig)                           # -2.6269 (docstring)
    loss, _ = run("sapo", [[0.0]], [[-1.0]])                                # tau_neg = 1.05 at r = 1: A 4 / 2.1
    assert loss.item() == pytest.approx(4 * 0.5 / 1.05)
    logp = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
    one = torch.ones(1, 1, dtype=torch.float64)
    b = Batch({"old_logprobs": one * -1.5, "advantages": one, "response_mask": one})
    POLICY_LOSSES["sapo"](logp, b, C, LossNorm.of(b["response_mask"]))[0].backward()
    r = math.exp(0.5)
    assert logp.grad.item() == pytest.approx(-4 * sig * (1 - sig) * r)


def test_dro_quadratic_penalty_and_its_required_beta():
    loss, m = run("dro", [[0.5]], [[2.0]], cfg=PolicyLossConfig(dro_beta=0.1))
    assert loss.item() == pytest.approx(2.0125)                             # -(2 x -1 - 0.05 x 0.25)
    assert m["ppo_kl"].item() == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="actor.loss.dro_beta must be > 0"):
        run("dro", [[0.5]], [[2.0]])


@pytest.mark.parametrize("name,delta", [("dppo_tv", 0.2), ("dppo_kl", 0.05)])
def test_dppo_drops_tokens_outside_the_trust_region_and_truncates_the_weight(name, delta):
    """p_old 0.2 -> p 0.5 (r 2.5): the TV move 0.3 > 0.2 and the binary KL 0.1927 > 0.05 are outside for A > 0
    (the advantage pushes p up) and inside for A < 0 (p >= p_old there); l = -A min(r, C) logp."""
    cfg = PolicyLossConfig(dppo_delta_low=delta, dppo_delta_high=delta)
    lp, old = math.log(0.5), math.log(0.2)
    loss, m = run(name, [[lp - old]], [[1.0]], logp=[[lp]], cfg=cfg)
    assert loss.item() == 0.0 and m["pg_clipfrac"].item() == 1.0
    loss, m = run(name, [[lp - old]], [[-1.0]], logp=[[lp]], cfg=cfg)
    assert loss.item() == pytest.approx(2.5 * lp) and m["pg_clipfrac"].item() == 0.0    # -1.7329
    capped = PolicyLossConfig(dppo_delta_low=delta, dppo_delta_high=delta, dppo_is_cap=2.0)
    loss, m = run(name, [[lp - old]], [[-1.0]], logp=[[lp]], cfg=capped)
    assert loss.item() == pytest.approx(2.0 * lp) and m["pg_is_capped_frac"].item() == 1.0
    kl = 0.2 * math.log(0.2 / 0.5) + 0.8 * math.log(0.8 / 0.5)
    assert kl == pytest.approx(0.19275, abs=1e-5)
    # a small move stays inside on both sides
    loss, m = run(name, [[0.01]], [[1.0]], logp=[[math.log(0.2)]], cfg=cfg)
    assert m["pg_clipfrac"].item() == 0.0 and loss.item() == pytest.approx(-math.exp(0.01) * math.log(0.2))


def test_reinforce_token_and_sequence_importance_weights():
    lr, lp = [[0.5, -0.5]], [[-1.0, -1.0]]
    loss, m = run("reinforce", lr, [[1.0, 1.0]], logp=lp)
    assert loss.item() == pytest.approx((math.exp(0.5) + math.exp(-0.5)) / 2)   # [1.6487, 0.6065], token-mean
    assert m["is_weight_mean"].item() == pytest.approx((math.exp(0.5) + math.exp(-0.5)) / 2)
    loss, _ = run("reinforce", lr, [[1.0, 1.0]], logp=lp, cfg=PolicyLossConfig(reinforce_is="sequence"))
    assert loss.item() == pytest.approx(1.0)                                      # the product e^0 = 1
    loss, m = run("reinforce", [[1.0, 0.0]], [[1.0, 1.0]], logp=lp, cfg=PolicyLossConfig(reinforce_is_cap=2.0))
    assert loss.item() == pytest.approx((2.0 + 1.0) / 2) and m["is_capped_frac"].item() == 0.5
    loss, _ = run("reinforce", lr, [[1.0, 1.0]], logp=lp, cfg=PolicyLossConfig(reinforce_is=""))
    assert loss.item() == pytest.approx(1.0)                                      # GPG: -A logp


def test_gspo_averages_the_true_token_log_ratios_and_clamps_only_the_sequence():
    """s = exp(min(mean_t d, 10)) from unclamped d (verl): [30, -22] has mean 4, where clamping each token to +-20
    first gave mean 0 (s = 1). A = -1: max(-A s, -A clip(s)) = max(e^4, 1.2) = e^4 on both tokens."""
    loss, _ = run("gspo", [[30.0, -22.0]], [[-1.0, -1.0]])
    assert loss.item() == pytest.approx(math.exp(4.0))                      # 54.598; was 1.0
    loss, _ = run("gspo", [[30.0, 30.0]], [[-1.0, -1.0]])
    assert loss.item() == pytest.approx(math.exp(10.0))                     # the sequence-level clamp at 10


def test_geo_mean_keeps_unclamped_token_log_ratios_and_bounds_the_mean_at_20():
    """d' = sgn(A) min(sgn(A) d, sgn(A) clip(d, -0.2, 0.2)) on the true d (verl clamps no token): A < 0 keeps a
    large d, A > 0 a large negative one; only the mean is bounded (<= 20, ours, against exp overflow)."""
    loss, _ = run("geo_mean", [[30.0, 0.1]], [[-1.0, -1.0]])                 # d' = [30, 0.1]
    assert loss.item() == pytest.approx(math.exp(15.05))                    # was e^10.05 (30 clamped to 20)
    loss, _ = run("geo_mean", [[-30.0, 0.5]], [[1.0, 1.0]])                  # d' = [-30, 0.2]
    assert loss.item() == pytest.approx(-math.exp(-14.9))                   # was -e^-9.9
    loss, _ = run("geo_mean", [[50.0, 50.0]], [[-1.0, -1.0]])                # mean 50 -> 20
    assert loss.item() == pytest.approx(math.exp(20.0))


def test_gspo_and_geo_mean_ppo_kl_is_the_true_mean():
    _, m = run("gspo", [[30.0, -22.0]], [[1.0, 1.0]])
    assert m["ppo_kl"].item() == pytest.approx(-4.0)                        # was 0 (-(20 - 20) / 2)
    _, m = run("geo_mean", [[30.0, 0.1]], [[-1.0, -1.0]])
    assert m["ppo_kl"].item() == pytest.approx(-15.05)                      # was -10.05


def test_geo_mean_clipfrac_splits_by_advantage_sign_as_verl():
    """verl: c = [d outside [-eps_low, eps_high]]; pg_clipfrac = mean(c [A > 0]), pg_clipfrac_lower = mean(c [A < 0])
    over valid tokens -- c counts d = -0.5 under A > 0 although min(d, clip(d)) keeps d there."""
    loss, m = run("geo_mean", [[0.5, -0.5, 0.1], [0.5, 0.1, 0.9]], [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]],
                  mask=[[1, 1, 1], [1, 1, 0]])                              # c = [1, 1, 0], [1, 0, (masked)]
    assert m["pg_clipfrac"].item() == pytest.approx(2 / 5)
    assert m["pg_clipfrac_lower"].item() == pytest.approx(1 / 5)
    # seq 0: d' = [0.2, -0.5, 0.1] -> l = -e^(-0.2/3); seq 1: d' = [0.5, 0.1] -> l = e^0.3
    assert loss.item() == pytest.approx((-math.exp(-0.2 / 3) + math.exp(0.3)) / 2)


def test_sppo_and_sequence_reinforce_sum_the_true_token_log_ratios():
    """Sums over a sequence take unclamped token log-ratios: sppo none at all (verl's recipe), reinforce's sequence
    weight clamps only the sum to +-20 (verl's TIS). A per-token clamp to +-20 changed both sums."""
    loss, _ = run("sppo", [[30.0, 0.0]], [[0.5, 0.5]])
    assert loss.item() == pytest.approx((30 - 0.5) ** 2)                     # 870.25; was (20 - 0.5)^2
    seq = PolicyLossConfig(reinforce_is="sequence")
    loss, m = run("reinforce", [[25.0, -24.5]], [[1.0, 1.0]], logp=[[-1.0, -1.0]], cfg=seq)
    assert loss.item() == pytest.approx(math.exp(0.5))                      # w = e^0.5 on both; was e^0
    assert m["ppo_kl"].item() == pytest.approx(-0.25)
    loss, _ = run("reinforce", [[15.0, 15.0]], [[1.0, 1.0]], logp=[[-1.0, -1.0]],
                  cfg=PolicyLossConfig(reinforce_is="sequence", reinforce_is_cap=1e12))
    assert loss.item() == pytest.approx(math.exp(20.0))                     # the sum 30 clamped to 20
