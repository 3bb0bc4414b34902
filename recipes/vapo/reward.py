"""This recipe's reward (verl signature), by data source -- edit this function to change the reward:

- DAPO-Math-17k (``math_dapo``) and AIME 2024 (``aime24``), the paper's data: DAPO's rule -- the text after the
  last ``Answer:``, normalised, equals the ground truth: +1, else -1 (core's ``math_dapo``).
- GSM8K: strict ``#### n`` (1 or 0; core's ``gsm8k``), with no partial credit for the format: the positive-example
  NLL (``actor.positive_nll_coef``) trains on the samples whose score is > 0, so only correct ones may score > 0.
- ``hybridrl/arith`` (the CPU runs' task) and every other data source: core's registry (arith: 1.0 when the last
  number of the response is the answer, else 0).
"""

from core.rewards import default_compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source == "aime24":  # the paper scores AIME by its Answer: rule too, not by \boxed{}
        data_source = "math_dapo"
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
