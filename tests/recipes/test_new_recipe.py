"""``hybridrl new``: a copied recipe points at itself, starts "not measured", and its train.py is the one that runs --
edit one phase of the copy's step and the run shows the edit. Copies go into a temporary recipes/ folder."""

import shutil
from pathlib import Path

import pytest

from core.cli import main as cli_main
from core.expected import load_expected
from core.report import read_metrics
from core.scaffold import new_recipe, rewrite, tiny_data, tiny_overrides

ROOT = Path(__file__).resolve().parents[2]


def test_rewrite_touches_self_references_only():
    text = ("# bash recipes/grpo/run_smollm2_cpu.sh\n  output_dir: outputs/grpo_smollm2_cpu_demo\n"
            "  experiment_name: grpo-qwen\n    estimator: grpo\n  data_source: openai/gsm8k\n"
            "hybridrl train grpo --dry-run\nrecipes/grpo_old/x\n")
    assert rewrite(text, "grpo", "myalgo") == (
        "# bash recipes/myalgo/run_smollm2_cpu.sh\n  output_dir: outputs/myalgo_smollm2_cpu_demo\n"
        "  experiment_name: myalgo-qwen\n    estimator: grpo\n  data_source: openai/gsm8k\n"
        "hybridrl train myalgo --dry-run\nrecipes/grpo_old/x\n")


@pytest.fixture()
def recipes(tmp_path):
    """A recipes/ folder holding a copy of this repository's grpo recipe."""
    folder = tmp_path / "recipes"
    shutil.copytree(ROOT / "recipes" / "grpo", folder / "grpo", ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def test_new_copies_rewrites_resets_and_runs_the_tiny_check(recipes):
    said = []
    dest = new_recipe("myalgo", recipes / "grpo", out=said.append)
    assert dest == recipes / "myalgo" and (dest / "train.py").is_file() and (dest / "reward.py").is_file()
    config = (dest / "config.yaml").read_text()
    assert "outputs/myalgo_smollm2_cpu" in config and "recipes/grpo" not in config
    assert rewrite("adv: {estimator: grpo}", "grpo", "myalgo") == "adv: {estimator: grpo}"  # a registry name stays
    assert "hybridrl train myalgo" in (dest / "train.py").read_text()
    assert load_expected(dest) == {} and "not measured" in (dest / "README.md").read_text()
    assert load_expected(recipes / "grpo") != {}  # the source is untouched
    assert said[1].startswith("tiny check: myalgo/train.py ran 2 steps") and "reward.py scores" in said[2]
    with pytest.raises(SystemExit, match="exists already"):
        new_recipe("myalgo", recipes / "grpo", check=False)
    with pytest.raises(SystemExit, match="is no recipe name"):
        new_recipe("My-Algo", recipes / "grpo", check=False)


def test_an_edited_phase_of_the_copys_step_is_what_trains(recipes, tmp_path, tiny_model_dir):
    """What `new` must show: new, edit one phase of train.py (a different advantage), train 2 steps."""
    dest = new_recipe("myalgo", recipes / "grpo", check=False, out=lambda _: None)
    train = dest / "train.py"
    code = train.read_text()
    phase = "        advantages(batch, cfg, timer)\n"
    assert code.count(phase) == 1
    # REINFORCE with the batch mean as baseline, one advantage per response, logged under a key of its own
    code = code.replace(phase, '        batch["advantages"] = (batch["scores"] - batch["scores"].mean())[:, None] * '
                               'batch["response_mask"]\n        batch["returns"] = batch["advantages"]\n')
    code = code.replace("    return batch, step_metrics(batch, updates | kl, timer, scored.num_failed, cfg)",
                        '    return batch, step_metrics(batch, updates | kl, timer, scored.num_failed, cfg) | '
                        '{"myalgo/adv_abs_mean": float(batch["advantages"].abs().mean())}')
    train.write_text(code)
    tiny_data(tmp_path)
    assert cli_main(["train", str(dest), *tiny_overrides(tmp_path, tiny_model_dir), "trainer.total_steps=2"]) == 0
    steps = read_metrics(tmp_path / "out" / "metrics.jsonl")
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m["myalgo/adv_abs_mean"] > 0 and m["actor/grad_norm"] > 0 for m in steps)


@pytest.mark.heavy
@pytest.mark.parametrize("source", ["sft", "distill"])
def test_new_from_the_sft_and_distill_recipes_passes_its_tiny_check(source, tmp_path):
    """A copy of the SFT recipe gets tiny rows with their conversations, a copy of the distillation recipe a tiny
    teacher: each copy's 2-step tiny run trains (the SFT step reports its loss, the distillation its reward)."""
    folder = tmp_path / "recipes"
    shutil.copytree(ROOT / "recipes" / source, folder / source, ignore=shutil.ignore_patterns("__pycache__", "*.png"))
    said = []
    new_recipe("myalgo", folder / source, out=said.append)
    assert said[1].startswith("tiny check: myalgo/train.py ran"), said
    assert ("sft/nll_loss" if source == "sft" else "reward/mean") in said[1], said
