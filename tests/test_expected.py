"""core.expected: tier files validate, figures come out of metrics rows by hand, bounds fail when broken."""

from pathlib import Path

import pytest

from core.expected import check, hardware_missing, load_expected, metric_figures, run_figures

RECIPES = sorted(p.parent for p in (Path(__file__).resolve().parents[1] / "recipes").glob("*/expected.yaml"))


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_recipe_has_a_cpu_tier_and_a_sourced_full_scale_tier(recipe):
    tiers = load_expected(recipe)
    assert tiers["cpu"]["hardware"]["gpus"] == 0 and (recipe / tiers["cpu"]["run"]).is_file()
    full = tiers["full_scale"]
    assert full["source"].startswith("https://") and full["hardware"]["gpus"] > 0 and (recipe / full["run"]).is_file()


def test_figures_by_hand():
    rows = [{"step": 0, "val/reward/mean": 0.5}]
    rows += [{"step": i, "reward/mean": r, "rollout/logprob_diff_mean": d}
             for i, (r, d) in enumerate([(0.2, 0.01), (0.4, 0.03), (0.6, 0.02), (0.8, 0.0), (1.0, 0.0)], 1)]
    rows[-1]["val/reward/mean"] = 0.75
    f = run_figures(rows)  # 5 steps: windows of 1 step
    assert f == pytest.approx({"steps": 5, "reward_start": 0.2, "reward_end": 1.0, "reward_gain": 0.8,
                               "rollout/logprob_diff_mean": 0.03, "val_start": 0.5, "val_end": 0.75, "val_gain": 0.25})


def test_a_distillation_runs_kl_to_its_teacher_at_the_start_and_end():
    rows = [{"step": i, "reward/mean": 0.5, "distill/reverse_kl": k} for i, k in enumerate([0.9, 0.5, 0.3, 0.1], 1)]
    f = run_figures(rows)  # 4 steps: windows of 1 step
    assert (f["distill_kl_start"], f["distill_kl_end"]) == pytest.approx((0.9, 0.1))
    assert "distill_kl_start" not in run_figures([{"step": 1, "reward/mean": 0.5}])


def test_check_names_each_broken_bound_and_missing_figure():
    tier = {"hardware": {"gpus": 0}, "steps": 5,
            "bounds": {"reward_end": {"min": 0.9}, "reward_start": {"max": 0.1}, "val_gain": {"min": 0.1, "max": 0.3},
                       "kl": {"max": 1}}}
    failures = check({"steps": 4, "reward_end": 0.8, "reward_start": 0.1, "val_gain": 0.25}, tier, "t")
    assert failures == ["t: reward_end = 0.8 < min 0.9", "t: figure 'kl' is not in the run's metrics "
                        "(have ['reward_end', 'reward_start', 'steps', 'val_gain'])", "t: ran 4 steps, the tier is for 5"]


def test_a_malformed_tier_is_an_error_naming_file_and_key(tmp_path):
    (tmp_path / "expected.yaml").write_text("cpu:\n  hardware: {gpus: 0}\n  bounds: {reward_end: 0.8}\n")
    with pytest.raises(ValueError, match=r"expected.yaml: tiers.cpu.bounds.reward_end must be"):
        load_expected(tmp_path)


def test_a_gpu_tier_says_what_this_cpu_machine_lacks():
    assert hardware_missing({"hardware": {"gpus": 0}}) is None
    import torch

    if not torch.cuda.is_available():
        assert hardware_missing({"hardware": {"gpus": 8}}) == "needs 8 GPUs, the host has 0"


def test_a_tier_needing_a_package_says_which_and_where(tmp_path):
    assert hardware_missing({"hardware": {"gpus": 0, "packages": ["json"]}}) is None
    why = hardware_missing({"hardware": {"gpus": 0, "packages": ["json", "vllm_not_here", "vllm"]}})
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        assert why.startswith("needs the package(s) ['vllm_not_here', 'vllm'] in this Python") and "make test-vllm" in why
    else:
        assert why.startswith("needs the package(s) ['vllm_not_here'] in this Python")


def test_first_last_and_max_of_any_logged_metric():
    rows = [{"step": 1, "dapo/num_gen_batches": 1}, {"step": 2, "dapo/num_gen_batches": 4, "val/a/avg@32": 0.3},
            {"step": 3, "dapo/num_gen_batches": 2, "val/a/avg@32": 0.5}]
    f = metric_figures(rows, ["max:dapo/num_gen_batches", "last:dapo/num_gen_batches", "last:val/a/avg@32",
                              "first:val/a/avg@32", "last:absent", "reward_end"])
    assert f == {"max:dapo/num_gen_batches": 4, "last:dapo/num_gen_batches": 2, "last:val/a/avg@32": 0.5,
                 "first:val/a/avg@32": 0.3}
    tier = {"bounds": {"max:dapo/num_gen_batches": {"min": 5}, "last:absent": {"min": 0}}}
    failures = check(f, tier, "t")
    assert failures[0] == "t: max:dapo/num_gen_batches = 4 < min 5" and "'last:absent' is not" in failures[1]
