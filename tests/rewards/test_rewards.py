"""Reward functions on tricky cases, the data_source registry, custom rewards, and batch scoring failures."""

import math
import time

import pytest

from core.rewards import (REWARDS, RewardError, default_compute_score, load_reward_fn, score_batch)
from core.rewards.gsm8k import extract_answer, ground_truth_from_solution
from core.rewards.math_answer import compute_score as math_score, compute_score_dapo, last_boxed, normalize


@pytest.mark.parametrize("text,strict,flexible", [
    ("so the total is 5 + 7 = 12.\n#### 12", "12", "12"),
    ("#### 1,000", "1000", "1000"),
    ("#### $42", None, "42"),                       # verl's strict regex does not allow '$' after ####
    ("first 3, then 4, finally 17.", None, "17"),   # the last of several numbers
    ("I don't know", None, None),
    ("#### -3.5", "-3.5", "-3.5"),
])
def test_gsm8k_extraction(text, strict, flexible):
    assert extract_answer(text, "strict") == strict
    assert extract_answer(text, "flexible") == flexible


def test_gsm8k_scores_and_ground_truth():
    assert default_compute_score("openai/gsm8k", "... #### 1,000", "1000") == {"score": 1.0, "acc": True, "pred": "1000"}
    assert default_compute_score("openai/gsm8k", "... #### 999", "1000")["score"] == 0.0
    assert default_compute_score("openai/gsm8k", "the answer is 1000", "1000")["score"] == 0.0  # strict needs ####
    assert default_compute_score("gsm8k_flexible", "the answer is 1000", "1000")["score"] == 1.0
    # the format-aware variant the recipes use on GSM8K: 0.1 for '#### n' with a wrong n, acc stays strict
    assert default_compute_score("gsm8k_format", "... #### 72", "72") == {"score": 1.0, "acc": True, "pred": "72"}
    assert default_compute_score("gsm8k_format", "... #### 71", "72") == {"score": 0.1, "acc": False, "pred": "71"}
    assert default_compute_score("gsm8k_format", "it is 72", "72") == {"score": 0.0, "acc": False, "pred": ""}
    assert ground_truth_from_solution("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72") == "72"
    with pytest.raises(ValueError, match="####"):
        ground_truth_from_solution("no marker")


@pytest.mark.parametrize("text,boxed", [
    ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
    ("\\boxed{\\{1, \\{2\\}\\}}", "\\{1, \\{2\\}\\}"),         # nested braces
    ("first \\boxed{1} then \\boxed{x^{2}}", "x^{2}"),         # the last box
    ("\\boxed 5", "5"),
    ("\\fbox{7}", "7"),
    ("no box here", None),
    ("\\boxed{unbalanced", None),
])
def test_last_boxed(text, boxed):
    assert last_boxed(text) == boxed


@pytest.mark.parametrize("pred,gold", [
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{0.5}", "\\frac{1}{2}"),
    ("\\boxed{\\frac12}", "1/2"),
    ("\\boxed{\\dfrac{3}{4}}", "0.75"),
    ("\\boxed{1,000}", "1000"),
    ("\\boxed{5 \\text{ cm}}", "5"),
    ("\\boxed{\\$10}", "10"),
    ("\\boxed{10\\%}", "10"),
    ("\\boxed{90^\\circ}", "90"),
    ("\\boxed{x = 3}", "3"),
    ("\\boxed{3.0}", "3"),
    ("\\boxed{\\left(1, 2\\right)}", "(1,2)"),
])
def test_math_equivalent_forms(pred, gold):
    assert math_score(pred, gold, use_math_verify=False) == 1.0  # our normaliser alone


@pytest.mark.parametrize("pred,gold", [("no answer at all", "3"), ("\\boxed{1,2}", "12"), ("\\boxed{0.333}", "\\frac{1}{3}"),
                                       ("\\boxed{4}", "5")])
def test_math_non_equivalent(pred, gold):
    assert math_score(pred, gold, use_math_verify=False) == 0.0


def test_normalize_examples():
    assert normalize("\\$1,000.00 \\text{ dollars}") == "1000"
    assert normalize("\\tfrac{1}{2}") == "\\frac{1}{2}"


def test_dapo_answer_format():
    ok = compute_score_dapo("Let me think... Answer: 34", "34")
    assert ok == {"score": 1.0, "acc": True, "pred": "34"}
    assert compute_score_dapo("Answer: \\boxed{\\frac{1}{2}}", "0.5")["score"] == 1.0
    assert compute_score_dapo("I think it is 34", "34")["score"] == -1.0
    assert default_compute_score("math_dapo", "Answer: 7", "8")["acc"] is False


def test_registry_names_unknown_sources():
    with pytest.raises(KeyError, match="no reward registered for data_source 'my/data'"):
        default_compute_score("my/data", "x", "y")
    assert {"openai/gsm8k", "aime24", "amc23", "minerva_math", "math_dapo"} <= set(REWARDS.names())


def test_custom_reward_from_file(tmp_path):
    f = tmp_path / "my_reward.py"
    f.write_text("def length_reward(data_source, solution_str, ground_truth, extra_info=None):\n"
                 "    return {'score': len(solution_str) / 10, 'len': len(solution_str)}\n")
    fn = load_reward_fn(f, "length_reward")
    out = score_batch(fn, ["d"] * 2, ["abc", "abcdef"], ["", ""], num_workers=2)
    assert out.scores.tolist() == pytest.approx([0.3, 0.6]) and out.extras == {"len": [3, 6]}
    with pytest.raises(AttributeError, match="has no function 'nope'"):
        load_reward_fn(f, "nope")
    with pytest.raises(FileNotFoundError, match="missing.py"):
        load_reward_fn(tmp_path / "missing.py")


def flaky(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "boom":
        raise ValueError("cannot parse")
    if solution_str == "nan":
        return math.nan
    if solution_str == "-inf":
        return -math.inf
    if solution_str == "hang":
        time.sleep(30)
    return 1.0


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_scoring_names_the_failing_sample(workers):
    with pytest.raises(RewardError, match=r"sample 1 \(data_source='ds'\) raised ValueError: cannot parse"):
        score_batch(flaky, ["ds"] * 3, ["ok", "boom", "ok"], ["1"] * 3, num_workers=workers)
    with pytest.raises(RewardError, match=r"sample 2 \(data_source='ds'\) is NaN"):
        score_batch(flaky, ["ds"] * 3, ["ok", "ok", "nan"], ["1"] * 3, num_workers=workers)
    with pytest.raises(RewardError, match=r"sample 0 \(data_source='ds'\) is -inf"):   # inf: as bad as NaN
        score_batch(flaky, ["ds"] * 2, ["-inf", "ok"], ["1"] * 2, num_workers=workers)


def test_batch_scoring_fallback_counts_failures_and_survives_a_hang():
    t = time.monotonic()
    out = score_batch(flaky, ["ds"] * 6, ["ok", "hang", "boom", "ok", "nan", "ok"], ["1"] * 6,
                      num_workers=1, timeout_s=1.0, fallback=-1.0)
    assert out.scores.tolist() == [1.0, -1.0, -1.0, 1.0, -1.0, 1.0] and out.num_failed == 3
    assert time.monotonic() - t < 25  # the hung call was abandoned, not waited for (it sleeps 30 s)
    with pytest.raises(RewardError, match="sample 1 .* timed out"):
        score_batch(flaky, ["ds"] * 2, ["ok", "hang"], ["1"] * 2, num_workers=1, timeout_s=0.5)


def test_grpo_recipe_reward_is_format_aware():
    from pathlib import Path

    fn = load_reward_fn(Path(__file__).parents[2] / "recipes" / "grpo" / "reward.py")
    assert fn("openai/gsm8k", "so #### 72", "72") == {"score": 1.0, "acc": True, "pred": "72"}
    assert fn("openai/gsm8k", "so #### 71", "72")["score"] == 0.1
    assert fn("openai/gsm8k", "so 72", "72")["score"] == 0.0


def test_the_timeout_holds_without_reward_workers_too():
    """reward_workers: 0 scores in the driver; a hanging reward function hung the driver (the timeout applied to
    worker processes only). Now SIGALRM bounds it there, and the next call runs normally."""
    t = time.monotonic()
    with pytest.raises(RewardError, match="sample 1 .* timed out"):
        score_batch(flaky, ["ds"] * 2, ["ok", "hang"], ["1"] * 2, num_workers=0, timeout_s=0.5)
    out = score_batch(flaky, ["ds"] * 3, ["ok", "hang", "ok"], ["1"] * 3, num_workers=0, timeout_s=0.3, fallback=-1.0)
    assert out.scores.tolist() == [1.0, -1.0, 1.0] and out.num_failed == 1
    assert time.monotonic() - t < 10
