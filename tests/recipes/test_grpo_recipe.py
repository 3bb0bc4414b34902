"""recipes/grpo: configs validate, the reward and the arithmetic data are right by hand, and (slow) the CPU demo
reproduces recipes/grpo/expected.yaml."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.cli import recipe_module
from core.expected import check, load_expected, run_figures
from core.report import read_metrics
from core.rewards import load_reward_fn
from core.run import load_run_config
from tests.recipes.plans import plan

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "grpo"
EXPECTED = load_expected(RECIPE)


def load_recipe_module(name):
    return recipe_module(RECIPE, name)


@pytest.mark.parametrize("name", ["config", "demo_cpu"])
def test_recipe_configs_validate_and_sizes_add_up(name):
    from core.plan_report import effective_sizes

    cfg = load_run_config(RECIPE, name)
    assert cfg.actor.temperature == cfg.algo.sampling.temperature  # log-probs under the sampling distribution
    assert "samples per step" in effective_sizes(cfg, dp_size=2)


def test_demo_config_is_what_expected_yaml_describes():
    demo = EXPECTED["cpu"]
    cfg = load_run_config(RECIPE, "demo_cpu")
    assert cfg.trainer.total_steps == demo["steps"] and cfg.data.train_files == ["outputs/data/arith_v2/train.parquet"]


def test_reward_by_hand():
    fn = load_reward_fn(RECIPE / "reward.py")
    arith = "hybridrl/arith"
    assert fn(arith, "3 * 4 = 12", "12")["score"] == 1.0
    assert fn(arith, "#### 12", "12")["score"] == 1.0
    assert fn(arith, "12, or maybe 13", "12")["score"] == 0.0          # the last number counts
    assert fn(arith, "To find 3 * 4 we first", "12")["score"] == 0.0   # cut off before an answer
    assert fn("openai/gsm8k", "so #### 72", "72")["score"] == 1.0
    assert fn("openai/gsm8k", "so #### 71", "72")["score"] == 0.1      # format only
    assert fn("openai/gsm8k", "it is 72", "72")["score"] == 0.0        # strict: no ####


def test_the_demo_reads_the_held_out_arith_split():
    """The demo's train and val files are core.data.arith's, whose test split is held out by content
    (tests/data/test_arith.py); a run writes them with the recipe's data.py."""
    from core.data import arith
    from core.data.recipe_data import recipe_datasets

    cfg = load_run_config(RECIPE, "demo_cpu")
    assert cfg.data.train_files == [f"outputs/data/{arith.FOLDER}/train.parquet"]
    assert cfg.data.val_files == [f"outputs/data/{arith.FOLDER}/test.parquet"]
    assert arith.FOLDER in recipe_datasets(RECIPE)  # the run writes the folder the config names (data.py)


@pytest.mark.slow
@pytest.mark.parametrize("tier", ["cpu", "cpu_verl"])
def test_cpu_demo_reproduces_expected_yaml(tmp_path, tier):
    """The real demo (about 5 minutes on 2 cores with bf16): SmolLM2-135M-Instruct, 2 Ray workers, demo_cpu.yaml --
    and the same run from verl's keys (cpu_verl: hybridrl train --verl)."""
    env = dict(os.environ, PY=sys.executable)
    subprocess.run(["bash", str(RECIPE / EXPECTED[tier]["run"]), f"trainer.output_dir={tmp_path}"],
                   cwd=RECIPE.parents[1], env=env, check=True)
    history = read_metrics(tmp_path / "metrics.jsonl")
    figures = run_figures(history)
    print(json.dumps(figures))
    assert [m["step"] for m in history if "val/reward/mean" in m] == [0, EXPECTED[tier]["steps"]]
    assert check(figures, EXPECTED[tier], f"recipes/grpo {tier} tier") == []
    assert (tmp_path / "curves.png").is_file()


def test_full_scale_script_resolves_to_a_valid_config(capsys):
    """The GPU tier's yaml, planned: it composes and validates, and the batch arithmetic adds up."""
    rc, out = plan(capsys, "grpo", "qwen2_7b_gsm8k")
    assert rc == 0, out[-2000:]
    assert "Qwen/Qwen2-7B-Instruct on 8 cuda rank(s)" in out and "samples per step           5120" in out
