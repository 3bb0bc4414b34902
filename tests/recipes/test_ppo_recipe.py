"""recipes/ppo: configs validate into a run with a critic and GAE, the tiers are consistent with the configs, and
the full-scale script resolves. (The CPU tier itself runs in `make bench`: bench/test_scores.py.)"""

from pathlib import Path

import pytest

from core.cli import recipe_module
from core.expected import load_expected
from core.rewards import default_compute_score
from core.run import load_run_config
from tests.recipes.plans import plan

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "ppo"
EXPECTED = load_expected(RECIPE)


@pytest.mark.parametrize("name", ["config", "demo_cpu"])
def test_configs_have_a_critic_gae_and_no_reference(name):
    from core.plan_report import effective_sizes
    from core.roles import role_specs

    cfg = load_run_config(RECIPE, name)
    assert cfg.use_critic and cfg.algo.adv.estimator == "gae" and cfg.actor.kl_loss_coef == 0
    assert set(role_specs(cfg)) == {"actor", "rollout", "critic"}
    assert cfg.actor.temperature == cfg.algo.sampling.temperature
    assert "samples per step" in effective_sizes(cfg, dp_size=2)


def test_cpu_tier_describes_the_demo_config():
    cfg = load_run_config(RECIPE, "demo_cpu")
    assert EXPECTED["cpu"]["steps"] == cfg.trainer.total_steps and cfg.trainer.critic_warmup < cfg.trainer.total_steps


def test_full_scale_script_resolves_to_a_valid_config(capsys):
    rc, out = plan(capsys, "ppo", "qwen2_5_0_5b_gsm8k")
    assert rc == 0, out[-2000:]
    assert "Qwen/Qwen2.5-0.5B-Instruct on 2 cuda rank(s)" in out


def test_the_reward_model_config_has_four_models_and_trains_on_the_model_alone():
    from core.roles import role_specs

    cfg = load_run_config(RECIPE, "demo_cpu_rm")
    assert set(role_specs(cfg)) == {"actor", "rollout", "critic", "ref", "reward_model"}
    assert cfg.algo.reward_function_weight == 0 and cfg.algo.reward_model_weight == 1
    assert cfg.algo.kl_in_reward.coef > 0 and cfg.trainer.total_steps == EXPECTED["cpu_rm"]["steps"]


def test_preference_pairs_prefer_the_rule_s_truth():
    """rm_pairs.py: every chosen answer is right by the rule and every rejected one wrong; an edited pair differs
    in its last number alone."""
    import random

    pairs = recipe_module(RECIPE, "rm_pairs")
    assert pairs.with_last_number("3 * 4 = 12, so 12.", 13) == "3 * 4 = 12, so 13." and pairs.with_last_number("no", 1) is None
    rng = random.Random(0)
    assert all(pairs.wrong_result(3, "*", 4, rng) != 12 for _ in range(50))
    answers = ["3 * 4 = 12", "It is 7", "3 * 4 is 13.", "Let me think"]
    rows = pairs.pairs_of_problem((3, "*", 4), answers, per_problem=4, rng=rng)
    natural = [r for r in rows if r["kind"] == "natural"]
    edited = [r for r in rows if r["kind"] == "edited"]
    assert len(natural) == 3 and len(edited) == 3  # 1 right x 3 wrong; "Let me think" has no number to edit
    truth = lambda text: default_compute_score("hybridrl/arith", text, "12")["score"]
    assert all(truth(r["chosen"]) == 1 and truth(r["rejected"]) == 0 for r in rows)
    assert {r["chosen"] for r in edited} == {"3 * 4 = 12", "It is 12", "3 * 4 is 12."}
    assert rows[0]["prompt"] == [{"role": "user", "content": "What is 3 * 4? Reply with the answer in the form #### <number>."}]


@pytest.mark.parametrize("placement,pools", [("colocated", ["main"]), ("split", ["policy", "scorers"])])
def test_the_four_model_full_scale_script_plans_both_placements(capsys, placement, pools):
    # run_qwen2_7b_rm.sh plans qwen2_7b_rm.yaml, or qwen2_7b_rm_split.yaml with PLACEMENT=split
    rc, out = plan(capsys, "ppo", "qwen2_7b_rm" + ("_split" if placement == "split" else ""))
    assert rc == 0, out[-2000:]
    assert "Qwen/Qwen2-7B-Instruct on" in out and "reward model FSDP2" in out
    assert out.count("\nfits") == len(pools) and "DOES NOT FIT" not in out
    for pool in pools:
        assert f"pool '{pool}'" in out
