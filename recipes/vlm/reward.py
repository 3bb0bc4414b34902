"""This recipe's reward (verl signature): verl's geo3k weighting, 0.9 x accuracy + 0.1 x format.

- ``hybridrl/vlm_shapes`` and ``hybridrl/vlm_shapes_blank`` (the CPU tier): accuracy 1 when the answer's last word
  is the picture's colour; format 1 when the answer is one word (the question asks for one word).
  Examples vs 'red': 'Red.' -> 1.0; 'The shape is red.' -> 0.9; 'blue' -> 0.1; 'The shape is blue.' -> 0.0.
- ``hiyouga/geometry3k`` (the full-scale script): verl's geo3k reward -- accuracy by the last \\boxed{} answer,
  format by verl's <think>...</think> then \\boxed{} layout.
"""

import re

from core.rewards.math_answer import is_equiv, last_boxed

WORD = re.compile(r"[a-z]+")
GEO3K_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source.startswith("hybridrl/vlm_shapes"):
        words = WORD.findall(solution_str.lower())
        acc = bool(words) and words[-1] == str(ground_truth)
        one_word = len(words) == 1
    elif data_source == "hiyouga/geometry3k":
        pred = last_boxed(solution_str)
        acc = pred is not None and is_equiv(pred, str(ground_truth))
        one_word = bool(GEO3K_FORMAT.fullmatch(solution_str.strip()))
        words = [pred or ""]
    else:
        raise ValueError(f"recipes/vlm/reward.py: no reward for data source {data_source!r}")
    return {"score": 0.9 * acc + 0.1 * one_word, "acc": acc, "pred": words[-1] if words else ""}
