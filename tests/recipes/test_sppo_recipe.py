"""recipes/sppo: the configs carry verl's SPPO settings (n = 1, batch soft-mean, squared loss, no reference), the
CPU run matches the GRPO CPU run's samples, the tiers agree with the configs, and the 7B script plans."""

from pathlib import Path

import pytest

from core.cli import recipe_module
from core.expected import load_expected
from core.run import load_recipe_config
from tests.recipes.plans import plan

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "sppo"
EXPECTED = load_expected(RECIPE)


@pytest.mark.parametrize("name", ["config", "demo_cpu", "qwen7b_math"])
def test_configs_carry_verls_sppo_settings(name):
    from core.checks import problems
    from core.roles import role_specs

    cfg, _ = load_recipe_config(RECIPE, name)
    assert set(role_specs(cfg)) == {"actor", "rollout"} and not cfg.use_ref and not cfg.use_critic
    assert cfg.algo.sampling.n == 1 and cfg.algo.adv.estimator == "sppo" and cfg.actor.loss.name == "sppo"
    assert cfg.algo.adv.sppo_beta == 1.0 and cfg.actor.loss.sppo_eta == 1.0 and cfg.actor.kl_loss_coef == 0
    assert cfg.actor.temperature == cfg.algo.sampling.temperature and problems(cfg) == []


def test_the_cpu_run_has_the_grpo_cpu_runs_samples_and_steps():
    sppo, _ = load_recipe_config(RECIPE, "demo_cpu")
    grpo, _ = load_recipe_config(RECIPE.parent / "grpo", "demo_cpu")
    assert sppo.data.prompts_per_step * sppo.algo.sampling.n == grpo.data.prompts_per_step * grpo.algo.sampling.n
    assert sppo.trainer.total_steps == grpo.trainer.total_steps == EXPECTED["cpu"]["steps"]
    assert sppo.actor.ppo_mini_batch_size == grpo.actor.ppo_mini_batch_size


def test_verls_full_scale_settings_and_tier():
    cfg, _ = load_recipe_config(RECIPE, "qwen7b_math")
    assert cfg.actor.model == "Qwen/Qwen2.5-7B-Instruct" and cfg.data.prompts_per_step == 1024
    assert cfg.actor.optim.lr == 1e-6 and cfg.actor.ppo_mini_batch_size == 256
    assert cfg.rollout.max_prompt_length == 1024 and cfg.algo.sampling.max_new_tokens == 512
    assert EXPECTED["full_scale"]["published"]["val/lighteval/MATH/pass@1"] == 0.656


def test_the_reward_reads_the_boxed_answer_and_a_hedge_scores_zero():
    reward = recipe_module(RECIPE, "reward")
    assert reward.compute_score("lighteval/MATH", "so \\boxed{0.5}, that is \\boxed{\\frac{1}{2}}", "\\frac{1}{2}")["score"] == 1.0
    assert reward.compute_score("lighteval/MATH", "first \\boxed{3}, so \\boxed{\\frac{1}{2}}", "\\frac{1}{2}")["score"] == 0.0
    assert reward.compute_score("lighteval/MATH", "so \\boxed{3}", "\\frac{1}{2}")["score"] == 0.0
    assert reward.compute_score("hybridrl/arith", "12", "12")["score"] == 1.0


def test_full_scale_script_plans_and_fits(capsys):
    rc, out = plan(capsys, "sppo", "qwen7b_math")
    assert rc == 0, out[-3000:]
    assert "Qwen/Qwen2.5-7B-Instruct on 4 cuda rank(s)" in out and "fits" in out
