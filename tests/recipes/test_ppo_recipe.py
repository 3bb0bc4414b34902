"""recipes/ppo: configs validate into a run with a critic and GAE, the tiers are consistent with the configs, and
the full-scale script resolves. (The CPU tier itself runs in `make bench`: bench/test_scores.py.)"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.expected import load_expected
from core.train import load_run_config

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "ppo"
EXPECTED = load_expected(RECIPE)


@pytest.mark.parametrize("name", ["config", "demo_cpu"])
def test_configs_have_a_critic_gae_and_no_reference(name):
    from core.trainer import effective_sizes, role_specs

    cfg = load_run_config(RECIPE, name)
    assert cfg.use_critic and cfg.algo.adv.estimator == "gae" and cfg.actor.kl_loss_coef == 0
    assert set(role_specs(cfg)) == {"actor", "rollout", "critic"}
    assert cfg.actor.temperature == cfg.algo.sampling.temperature
    assert "samples per step" in effective_sizes(cfg, dp_size=2)


def test_cpu_tier_describes_the_demo_config():
    cfg = load_run_config(RECIPE, "demo_cpu")
    assert EXPECTED["cpu"]["steps"] == cfg.trainer.total_steps and cfg.trainer.critic_warmup < cfg.trainer.total_steps


def test_full_scale_script_resolves_to_a_valid_config():
    out = subprocess.run(["bash", str(RECIPE / EXPECTED["full_scale"]["run"]), "--dry-run"], cwd=RECIPE.parents[1],
                         env=dict(os.environ, PY=sys.executable), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Qwen/Qwen2.5-0.5B-Instruct on 2 cuda rank(s)" in out.stdout
