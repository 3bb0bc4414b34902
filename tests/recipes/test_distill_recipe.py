"""recipes/distill: its configs validate (the CPU tier's teacher run is GRPO with no teacher; the distillation has a
teacher and no reference), the tier is what expected.yaml describes, the full-scale plan fits with the teacher's
lines, and (slow) the CPU tier -- its teacher trained first -- reproduces expected.yaml."""

from pathlib import Path

import pytest

from core.checks import check_run
from core.expected import load_expected
from core.run import load_recipe_config
from tests.recipes.plans import plan
from tests.recipes.tiers import reproduce

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "distill"
EXPECTED = load_expected(RECIPE)


def test_the_configs_validate_and_the_tier_is_what_expected_yaml_describes():
    cfg, _ = load_recipe_config(RECIPE, "config")
    check_run(cfg, own_step=True)
    assert set(cfg.placed_roles()) == {"actor", "rollout", "teacher"}
    assert cfg.algo.adv.estimator.startswith("distill_") and cfg.trainer.total_steps == EXPECTED["cpu"]["steps"]
    assert cfg.data.val_files == ["outputs/data/arith_v2/test.parquet"] and cfg.trainer.test_freq == 2
    grpo, _ = load_recipe_config(RECIPE, "teacher_cpu")
    check_run(grpo, own_step=True)
    assert set(grpo.placed_roles()) == {"actor", "rollout", "ref"} and grpo.algo.adv.estimator == "grpo"
    # the comparison changes the signal only: the same data, steps, batch, sampling and validation
    for key in ("data", "algo.sampling", "trainer.total_steps", "trainer.test_freq", "actor.ppo_mini_batch_size",
                "actor.temperature"):
        a, b = cfg, grpo
        for part in key.split("."):
            a, b = getattr(a, part), getattr(b, part)
        assert a == b, key
    assert grpo.trainer.save_freq == grpo.trainer.total_steps  # its last step is the teacher


def test_the_full_scale_run_plans_and_fits(capsys):
    rc, out = plan(capsys, "distill", "qwen3_8b_from_32b")
    assert rc == 0, out[-2000:]
    assert "teacher Qwen/Qwen3-32B: 32.76B parameters, 64 layers" in out
    assert "teacher shards (4Pt/W)                                  8.19 GB   train" in out
    assert out.rstrip().endswith("fits")


@pytest.mark.slow
def test_cpu_tier_reproduces_expected_yaml(tmp_path):
    """The real CPU tier (9 min 9 s on 2 cores with bf16): GRPO makes the teacher, then 20 distillation
    steps."""
    reproduce(RECIPE, EXPECTED["cpu"], tmp_path / "run", "recipes/distill cpu tier", TEACHER_RUN=str(tmp_path / "teacher"))
    assert (tmp_path / "teacher" / "hf" / "config.json").is_file() and (tmp_path / "run" / "curves.png").is_file()
