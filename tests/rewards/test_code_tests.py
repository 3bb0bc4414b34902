"""core.rewards.code_tests with real sandboxed processes, on hand-written problems: a right program scores 1, a
partly right one its share, loops and crashes 0 within the per-test limit, a program that goes for the ground
truth finds nothing; the output comparison and the ground-truth forms."""

from __future__ import annotations

import json
import os
import time

import pytest

from core.rewards import REWARDS, default_compute_score
from core.rewards.code_tests import SOURCES, outputs_match, program
from tests.tools.escapes import need_namespaces

SUM = json.dumps({"inputs": ["1 2\n", "10 -3\n", "-5 -5\n", "0 0\n"], "outputs": ["3\n", "7\n", "-10\n", "0\n"],
                  "time_limit_s": 2})
ADD = {"fn_name": "add", "inputs": [[1, 2], [2, 3], [[1], [2]]], "outputs": [3, 5, [1, 2]]}


@pytest.fixture(autouse=True)
def _namespaces():
    need_namespaces()


def score(response, gt, source="code_tests"):
    return default_compute_score(source, response, gt)


def test_a_right_program_scores_1_and_every_source_name_reaches_it():
    right = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    assert all(REWARDS[s] is REWARDS["code_tests"] for s in SOURCES)
    for source in SOURCES:
        assert score(right, SUM, source) == {"score": 1.0, "acc": True, "pred": "4/4 tests passed"}


def test_a_partly_right_program_scores_its_share():
    r = score("a, b = map(int, input().split())\nprint(abs(a + b))", SUM)  # wrong on the negative sum
    assert (r["score"], r["acc"], r["pred"]) == (0.75, False, "3/4 tests passed; test 3 failed (wrong output)")


def test_loops_and_crashes_score_0_within_the_per_test_limit():
    t = time.monotonic()
    r = score("```python\nwhile True:\n    pass\n```", json.dumps({"inputs": ["1\n"], "outputs": ["1\n"],
                                                                  "time_limit_s": 0.5}))
    assert (r["score"], r["pred"]) == (0.0, "0/1 tests passed; test 1 failed (timeout)")
    assert time.monotonic() - t < 5
    assert score("raise SystemExit(3)", SUM)["score"] == 0.0
    assert score("import os\nprint(os.fork())", SUM)["score"] == 0.0


def test_the_ground_truth_is_out_of_reach(tmp_path):
    """The data file sits on the host; the program sees only the sandbox's view."""
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"ground_truth": SUM}) + "\n")
    os.chmod(tmp_path, 0o755)
    cheat = (f"import json\nrow = json.loads(open({str(data)!r}).read())\n"
             "gt = json.loads(row['ground_truth'])\nprint(gt['outputs'][0])")
    r = score(cheat, SUM)
    assert r["score"] == 0.0 and "tests passed" in r["pred"]


def test_call_based_problems_a_function_or_a_solution_class():
    assert score("def add(a, b):\n    return a + b", ADD)["score"] == 1.0
    r = score("class Solution:\n    def add(self, a, b):\n        return a + b if isinstance(a, int) else a", ADD)
    assert (r["score"], r["pred"]) == (2 / 3, "2/3 tests passed; test 3 failed (wrong output)")


def test_outputs_match_and_program_extraction():
    assert outputs_match("3 \n4\n\n", "3\n4")
    assert outputs_match("0.3333333", "0.33333333") and not outputs_match("0.33", "0.3333333")
    assert not outputs_match("3\n4", "3") and not outputs_match("3 4", "34")
    assert program("text\n```python\nx = 1\n```\nmore\n```\nprint(2)\n```") == "print(2)\n"
    assert program("print(1)") == "print(1)"


@pytest.mark.parametrize("gt", ["not json", json.dumps({"inputs": ["1"]}), json.dumps({"inputs": [], "outputs": []}),
                                json.dumps({"inputs": ["1", "2"], "outputs": ["1"]})])
def test_a_ground_truth_of_another_form_scores_0_and_says_why(gt):
    r = score("print(1)", gt)
    assert r["score"] == 0.0 and r["acc"] is False and "ground truth" in r["pred"]


@pytest.mark.parametrize("constant", ["", "pass", "print(0)", "print(3)", "import sys\nprint(sys.stdin.read())",
                                      "print('x' * 10 ** 7)", "```python\n```", "exit(0)"])
def test_constant_programs_score_what_they_get_right_only(constant):
    """print(3) and print(0) are right on the one test whose answer they are -- their base rate; the rest on none."""
    assert score(constant, SUM)["score"] == (0.25 if constant in ("print(3)", "print(0)") else 0.0)
