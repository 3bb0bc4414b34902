"""core.data.arith: the CPU demo's task. Its test split is held out by content -- no test question occurs among the
training questions, in either operand order -- and the files the recipes' demos read are the ones it writes."""

import pytest

from core.data import arith
from core.data.dataset import load_rl_parquet
from core.rewards import default_compute_score


def question_terms(row):
    a, op, b = row["extra_info"]["question"].split("What is ")[1].split("?")[0].split()
    return int(a), op, int(b)


def test_test_questions_never_occur_in_training_by_content(tmp_path):
    paths = arith.write(tmp_path, train_count=4000, seed=0)
    train, test = load_rl_parquet([str(paths["train"])]), load_rl_parquet([str(paths["test"])])
    train_q = {r["prompt"][0]["content"] for r in train}
    test_q = [r["prompt"][0]["content"] for r in test]
    assert len(test) == len(set(test_q)) == 91 and len(train) == 4000
    assert not set(test_q) & train_q                                           # no string in common
    swapped = {arith.TEMPLATE.format(a=b, op=op, b=a) for a, op, b in map(question_terms, test)}
    assert not swapped & train_q                                               # nor the same problem as b op a
    assert len(train_q) == len(arith.problems("train")) == 197                 # 4000 draws cover the training set
    assert 288 == len(arith.problems("train")) + len(test)                     # every problem is in one split


def test_rows_are_seeded_and_their_answers_right():
    rows = arith.rows("train", 300, seed=0)
    assert rows == arith.rows("train", 300, seed=0) and rows != arith.rows("train", 300, seed=1)
    assert arith.rows("test") == arith.rows("test", 5, seed=9)                 # the test split is fixed
    for r in rows + arith.rows("test"):
        a, op, b = question_terms(r)
        assert r["reward_model"]["ground_truth"] == str(a + b if op == "+" else a * b)
        assert r["data_source"] == "hybridrl/arith" and r["prompt"][0]["content"] == r["extra_info"]["question"]
    with pytest.raises(ValueError, match="arith split must be 'train' or 'test', got 'val'"):
        arith.problems("val")


def test_the_split_is_the_same_on_every_machine():
    """sha256-chosen, not Python's salted hash(): these held-out problems are the ones quoted in the READMEs."""
    assert arith.problems("test")[:6] == [(1, "+", 1), (1, "+", 3), (1, "+", 5), (1, "+", 6), (1, "+", 10),
                                          (2, "+", 3)]
    assert sum(op == "*" for _, op, _ in arith.problems("test")) == 47


def test_the_registered_reward_is_the_last_number():
    score = lambda text: default_compute_score("hybridrl/arith", text, "12")["score"]
    assert score("3 * 4 = 12") == score("#### 12") == 1.0
    assert score("12, or maybe 13") == 0.0 and score("To find 3 * 4 we first") == 0.0
