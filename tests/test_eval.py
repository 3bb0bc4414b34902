"""The eval harness: pass@k / maj@k arithmetic by hand, and an end-to-end run on a tiny real model."""

import pytest

from core.config import SamplingParams
from core.rollout.engine import RolloutEngine
from core.eval import evaluate_rows, majority_correct, markdown_table, pass_at_k, summarize
from core.models import load_causal_lm, load_tokenizer


@pytest.mark.parametrize("n,c,k,expected", [(4, 1, 2, 0.5), (4, 0, 2, 0.0), (4, 3, 2, 1.0), (5, 2, 1, 0.4),
                                            (10, 3, 4, 1 - 35 / 210)])
def test_pass_at_k(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_majority_vote():
    assert majority_correct(["7", "8", "7"], [True, False, True])
    assert not majority_correct(["8", "7", "8"], [False, True, False])
    assert not majority_correct(["", "", ""], [False] * 3)
    assert majority_correct(["7", "8"], [True, False])  # a tie goes to the first seen


def test_summarize_by_hand():
    rows = [dict(data_source="a", problem=0, score=1.0, acc=True, pred="1", length=4),
            dict(data_source="a", problem=0, score=0.0, acc=False, pred="2", length=6),
            dict(data_source="a", problem=1, score=0.0, acc=False, pred="5", length=2),
            dict(data_source="a", problem=1, score=0.0, acc=False, pred="5", length=2),
            dict(data_source="b", problem=2, score=1.0, acc=True, pred="9", length=1),
            dict(data_source="b", problem=2, score=1.0, acc=True, pred="9", length=1)]
    out = summarize(rows, n=2, ks=[2])
    assert out["a"] == {"problems": 2, "samples": 4, "pass@1": 0.25, "avg@2": 0.25, "maj@2": 0.5,
                        "response_length/mean": 3.5, "pass@2": 0.5}
    assert out["b"]["pass@1"] == 1.0 and out["b"]["maj@2"] == 1.0
    assert markdown_table(out).splitlines()[2].startswith("| a | 2 | 4 | 0.2500")


def test_evaluate_rows_end_to_end_on_a_tiny_model(tiny_model_dir):
    engine = RolloutEngine(load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir)))

    def parity(data_source, solution_str, ground_truth, extra_info=None):
        ok = len(solution_str) % 2 == int(ground_truth)
        return {"score": float(ok), "acc": ok, "pred": solution_str[:1]}

    rows = [{"data_source": "toy", "prompt": [{"role": "user", "content": q}], "ground_truth": g, "extra_info": {}}
            for q, g in [("abc", "0"), ("hello", "1"), ("xy", "0")]]
    results, samples = evaluate_rows(engine, rows, SamplingParams(n=3, temperature=1.0, max_new_tokens=8, seed=2),
                                     ks=[2], reward_fn=parity)
    assert len(samples) == 9 and [s["problem"] for s in samples] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    expected = sum(len(s["response"]) % 2 == int(rows[s["problem"]]["ground_truth"]) for s in samples) / 9
    assert results["toy"]["pass@1"] == pytest.approx(expected)
    assert results["toy"]["problems"] == 3 and results["toy"]["samples"] == 9
