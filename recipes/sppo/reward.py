"""This recipe's reward (verl signature), by data source -- edit this function to change the reward:

- MATH (``lighteval/MATH``) and Minerva (``minerva_math``): the boxed answer (boxes that disagree: none) equals the
  ground truth after normalisation: 1, else 0 (core's ``math_boxed``: verl's MATH rule, but a hedge scores 0 and
  numbers compare exactly).
- ``hybridrl/arith`` (the CPU run's task) and every other data source: core's registry (arith: 1.0 when the last
  number of the response is the answer, else 0).

SPPO's "preference" here is this rule reward centred on the batch's soft-mean (README): no preference model.
"""

from core.rewards import default_compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
