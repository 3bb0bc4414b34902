"""This recipe's reward (verl signature), by data source:

- GSM8K, format-aware: 1.0 for the right ``#### n``, 0.1 for the format with a wrong number, 0 without ``####``.
  A 135M model starts near 0 on strict GSM8K (see README), so the format term gives GRPO groups varied rewards.
- ``hybridrl/arith`` (the CPU demo's task) and every other data source: core's registry (``default_compute_score``;
  arith: 1.0 when the last number of the response is the answer, else 0).
- DAPO-Math-17k (``math_dapo``) and AIME 2024 (``aime24``), the paper's data: DAPO's rule -- the text after the
  last ``Answer:``, normalised, equals the ground truth: +1, else -1 (core.rewards.math_answer.compute_score_dapo).
"""

from core.rewards import default_compute_score
from core.rewards.gsm8k import compute_score as gsm8k_score, extract_answer
from core.rewards.math_answer import compute_score_dapo


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source in ("math_dapo", "aime24"):
        return compute_score_dapo(solution_str, str(ground_truth))
    if data_source not in ("openai/gsm8k", "gsm8k"):
        return default_compute_score(data_source, solution_str, ground_truth, extra_info)
    pred = extract_answer(solution_str, "strict")
    score = gsm8k_score(solution_str, ground_truth, method="strict", format_score=0.1)
    return {"score": score, "acc": score == 1.0, "pred": pred or ""}
