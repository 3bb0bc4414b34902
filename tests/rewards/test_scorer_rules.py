"""The scorers' comparison rules on the classes a policy could game: tolerance, digit separators, the math-verify
fallback, DAPO's boxed fallback, scientific notation, answers far from the end, hostile inputs, the registry's
choice for evaluation sets. Each case was wrong before the rule was written down (core/rewards/numbers.py)."""

import time

import pytest

from core.rewards import default_compute_score, load_reward_fn
from core.rewards.gsm8k import compute_score as gsm8k_score
from core.rewards.math_answer import compute_score as math_score, compute_score_dapo, is_equiv, normalize

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("answer,gold,right", [
    ("0", "7.4e-12", False),            # an absolute / 1e-6 relative tolerance scored 0 right for a tiny gold
    ("7.41e-12", "7.4e-12", True),      # rounds to the gold at its written precision (1e-13)
    ("8e-12", "7.4e-12", False),
    ("2e-8", "1e-8", False),            # 1e-6 * max(1, |y|) read these as equal
    ("3000001", "3000000", False),      # an integer gold is exact
    ("3000001", "3e6", False),          # so is an integer times a power of ten
    ("3.1e6", "3e6", False),
    ("3.14159", "3.14", True),          # gold given to 1/100: rounds to it
    ("3.15", "3.14", False),
    ("3.145", "3.14", True),            # exactly half a unit away: rounds to it either way
    ("0.5", "\\frac{1}{2}", True),
    ("\\frac{2}{4}", "0.5", True),
    ("0.3333333", "\\frac{1}{3}", False),   # a decimal is not the fraction it approximates
    ("1011_2", "10112", False),         # float() read '_' as a digit separator
    ("10112", "1011_2", False),
    ("1,000", "1000", True),
    ("1,00", "100", False),             # not a thousands separator
    ("72.00", "72", True),
])
def test_numbers_compare_exactly_or_to_the_golds_written_precision(answer, gold, right):
    assert math_score(f"so \\boxed{{{answer}}}", gold) == float(right)


def test_gsm8k_compares_numbers_exactly():
    assert gsm8k_score("... #### 18.0000001", "18") == 0.0     # the float tolerance passed it
    assert gsm8k_score("... #### 72.00", "72") == 1.0          # by value: verl's string compare misses it
    assert gsm8k_score("... #### 1_8", "18") == 0.0
    assert gsm8k_score("... #### 3,4", "34") == 0.0            # a list, not 34


@pytest.mark.parametrize("answer,gold", [
    ("-1./3+1", "-1./3"), ("-1./3", "-1./3+1"),               # math-verify's first-match parse read both as -1
    ("x+1", "x"), ("x", "x+1"), ("2x+1", "2x"),
    ("3 \\text{ or } 4", "3"), ("3, 4", "4"), ("[3, 4]", "3"),
])
def test_the_math_verify_fallback_never_equates_different_answers(answer, gold):
    assert not is_equiv(answer, gold) and not is_equiv(gold, answer)


@pytest.mark.parametrize("answer,gold", [
    ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}"), ("2 r \\pi", "2\\pi r"), ("\\{1, 2\\}", "\\{2, 1\\}"),
    ("\\sqrt{2}", "1.414"), ("x^2 + 2x + 1", "(x+1)^2"),
])
def test_the_math_verify_fallback_widens_what_is_equal(answer, gold):
    assert is_equiv(answer, gold)


def test_dapo_without_an_answer_line_takes_the_boxed_answer_as_verl():
    assert compute_score_dapo("so the result is \\boxed{34}.", "34")["score"] == 1.0
    assert compute_score_dapo("so the result is \\boxed{33}.", "34")["score"] == -1.0
    assert compute_score_dapo("Answer: 33\n and \\boxed{34}", "34")["score"] == -1.0    # the Answer: line decides
    assert compute_score_dapo("no answer at all", "34") == {"score": -1.0, "acc": False, "pred": ""}
    for recipe in ("dapo", "vapo"):
        fn = load_reward_fn(ROOT / "recipes" / recipe / "reward.py")
        assert fn("math_dapo", "thinking... \\boxed{34}", "34")["score"] == 1.0


@pytest.mark.parametrize("answer,wrong,gold", [
    ("8.49 \\times 10^{-4}", "8.59 \\times 10^{-4}", "8.49e-4"), ("8.49\\cdot10^{-4}", "8.49\\cdot10^{-5}", "8.49e-4"),
    ("8.49e-4", "8.5e-4", "8.49 \\times 10^{-4}"), ("0.000849", "0.00085", "8.49e-4"),
    ("2.19 \\times 10^{6}", "2.2 \\times 10^{6}", "2.19e6"), ("10^{5}", "10^{6}", "100000"),
    ("8.49 × 10^{−4}", "8.49 × 10^{4}", "8.49e-4"),
])
def test_scientific_notation(answer, wrong, gold):
    assert is_equiv(answer, gold)
    assert not is_equiv(wrong, gold)


def test_an_answer_far_from_the_end_still_counts():
    tail = "\nLet me double-check: " + "each step above follows from the one before. " * 60
    assert gsm8k_score("... #### 42" + tail, "42") == 1.0
    assert math_score("... \\boxed{42}" + tail, "42") == 1.0
    assert compute_score_dapo("Answer: 42" + tail, "42")["score"] == 1.0
    # the last marker counts, wherever it is; earlier markers must agree with it (else a hedge)
    assert gsm8k_score("#### 42.0\n" + tail + "#### 42\n" + tail, "42") == 1.0
    assert gsm8k_score("#### 41\n" + tail + "#### 42\n" + tail, "42") == 0.0
    assert compute_score_dapo("Answer: 41\n" + tail + "Answer: 42\n" + tail, "42")["score"] == -1.0


def test_hedges_score_wrong():
    assert math_score("\\boxed{3} or maybe \\boxed{4}", "4") == 0.0
    assert math_score("\\boxed{\\frac{1}{2}}, that is \\boxed{0.5}", "0.5") == 1.0   # equal boxes are no hedge
    assert math_score("\\boxed{\\boxed{4}}", "4") == 1.0                               # a box in a box: one answer
    assert gsm8k_score("... #### 3 or 4", "3") == 0.0
    assert gsm8k_score("... #### 4 dollars", "4") == 1.0
    assert compute_score_dapo("Answer: 3 or 4", "3")["score"] == -1.0
    assert default_compute_score("gsm8k_flexible", "it is 12 or 13", "13")["score"] == 0.0    # the last of a hedge
    assert default_compute_score("gsm8k_flexible", "it is 12, 12", "12")["score"] == 1.0      # a repeat is no hedge
    assert gsm8k_score("#### 3e0", "3") == 1.0 and gsm8k_score("#### 3e5", "3") == 0.0   # verl reads both as 3
    assert math_score("\\boxed{1.41421356}", "\\sqrt{2}") == 0.0       # a decimal is not the irrational it rounds
    assert math_score("\\boxed{2}", "\\sqrt{4}") == 1.0
    assert math_score("\\boxed{1011_{2}}", "1011_2") == 1.0


HOSTILE = {
    "spaces in a box": lambda n: "\\boxed{" + " " * n + "5}",
    "many boxes": lambda n: "\\boxed{1}" * (n // 8),
    "nested braces": lambda n: "\\boxed{" + "{" * n + "1" + "}" * n + "}",
    "nested boxes": lambda n: "\\boxed{" * (n // 7) + "1" + "}" * (n // 7),
    "unbalanced boxes": lambda n: "\\boxed{" * (n // 7),
    "answer lines": lambda n: "Answer:" * (n // 7),
    "answer then spaces": lambda n: "Answer" + " " * n,
    "huge denominator": lambda n: "\\boxed{\\frac{1}{" + "9" * n + "}}",
    "huge exponent": lambda n: "\\boxed{1e" + "9" * n + "}",
    "hashes": lambda n: "#### " * (n // 5),
    "digits": lambda n: "1" * n,
    "digits and commas": lambda n: "1," * (n // 2),
    "think and boxes": lambda n: "<think>" + "</think>\\boxed{" * (n // 15),
    "units": lambda n: "\\boxed{5" + " dollars" * (n // 8) + "}",
}
SCORERS = ["openai/gsm8k", "gsm8k_flexible", "gsm8k_format", "math", "minerva_math", "math_dapo", "hybridrl/arith"]


def _best_of(fn, repeats=3):
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_every_scorer_is_linear_and_never_raises_on_hostile_input(name):
    vlm = load_reward_fn(ROOT / "recipes" / "vlm" / "reward.py")
    agent = load_reward_fn(ROOT / "recipes" / "agent" / "reward.py")

    def score_all(text):
        for source in SCORERS:
            default_compute_score(source, text, "5")
        vlm("hiyouga/geometry3k", text, "5")
        agent("math_dapo", text, "5", {"num_turns": 2})

    small, large = HOSTILE[name](20_000), HOSTILE[name](200_000)
    score_all(small)  # warm caches and imports
    ratio = _best_of(lambda: score_all(large)) / max(_best_of(lambda: score_all(small)), 1e-4)
    assert ratio < 25, f"{name}: 10x the input cost {ratio:.1f}x the time (quadratic: ~100x)"


def test_normalize_is_linear_in_runs_of_whitespace():
    small, large = "\\boxed{" + " " * 6_000 + "}", "\\boxed{" + " " * 60_000 + "}"
    ratio = _best_of(lambda: normalize(large)) / max(_best_of(lambda: normalize(small)), 1e-5)
    assert ratio < 25, f"10x the spaces cost {ratio:.1f}x the time"


def test_evaluation_sets_score_zero_one_and_dapo_plus_minus_one():
    """The registry's explicit choice: verl sends 'math' and 'aime*' to math_dapo (+1 / -1); here they are evaluation
    sets scored 0 / 1 by the boxed answer, and the DAPO and VAPO recipes map 'aime24' to verl's rule."""
    for source in ("math", "aime24", "amc23", "minerva_math"):
        assert default_compute_score(source, "\\boxed{3}", "4")["score"] == 0.0
        assert default_compute_score(source, "\\boxed{4}", "4")["score"] == 1.0
    assert default_compute_score("math_dapo", "\\boxed{3}", "4")["score"] == -1.0
    for recipe in ("dapo", "vapo"):
        assert load_reward_fn(ROOT / "recipes" / recipe / "reward.py")("aime24", "Answer: 3", "4")["score"] == -1.0
