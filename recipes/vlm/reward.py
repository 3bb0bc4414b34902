"""This recipe's reward (verl signature): verl's geo3k weighting, 0.9 x accuracy + 0.1 x format.

- ``hybridrl/vlm_shapes`` and ``hybridrl/vlm_shapes_blank`` (the CPU tier): accuracy 1 when the answer's last word
  is the picture's colour; format 1 when the answer is one word (the question asks for one word).
  Examples vs 'red': 'Red.' -> 1.0; 'The shape is red.' -> 0.9; 'blue' -> 0.1; 'The shape is blue.' -> 0.0.
- ``hiyouga/geometry3k`` (the full-scale script): verl's geo3k reward -- accuracy by the boxed answer (boxes that
  disagree: none),
  format by verl's layout: the response starts with <think>, then </think>, then \\boxed{, then } (checked by
  ``find``: verl's regex ``<think>.*</think>.*\\boxed\\{.*\\}.*`` backtracks for minutes on a response that repeats
  ``</think>\\boxed{``; this reads the same layout in linear time).
"""

import re

from core.rewards.math_answer import boxed_answer, is_equiv

WORD = re.compile(r"[a-z]+")


def geo3k_format(text: str) -> bool:
    """verl's geo3k format: '<think>' at the start, then '</think>', then '\\boxed{', then '}'."""
    think = text.find("</think>", 7) if text.startswith("<think>") else -1
    box = text.find("\\boxed{", think + 8) if think >= 0 else -1
    return box >= 0 and text.find("}", box + 7) >= 0


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source.startswith("hybridrl/vlm_shapes"):
        words = WORD.findall(solution_str.lower())
        acc = bool(words) and words[-1] == str(ground_truth)
        one_word = len(words) == 1
    elif data_source == "hiyouga/geometry3k":
        pred = boxed_answer(solution_str)
        acc = pred is not None and is_equiv(pred, str(ground_truth))
        one_word = geo3k_format(solution_str.strip())
        words = [pred or ""]
    else:
        raise ValueError(f"recipes/vlm/reward.py: no reward for data source {data_source!r}")
    return {"score": 0.9 * acc + 0.1 * one_word, "acc": acc, "pred": words[-1] if words else ""}
