"""This recipe's reward (verl signature), by data source -- edit this function to change the reward. PRIME trains
its implicit PRM on these scores as labels, so each must lie in [0, 1]:

- GSM8K: format-aware (core's ``gsm8k_format``): 1.0 for the right ``#### n``, 0.1 for the format with a wrong
  number (a soft label), 0 without ``####``.
- ``hybridrl/arith`` (the CPU runs' task), MATH, AIME, AMC, Minerva: core's registry (1 right / 0 wrong).
- Eurus-2-RL-Data's math sources (``numina_*``, ...; the full-scale run): the boxed answer (boxes that disagree:
  none), as MATH.
"""

from core.rewards import REWARDS, default_compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source in ("openai/gsm8k", "gsm8k"):
        data_source = "gsm8k_format"
    elif data_source not in REWARDS.names():  # Eurus-2-RL-Data's math sources: boxed answers
        data_source = "math"
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
