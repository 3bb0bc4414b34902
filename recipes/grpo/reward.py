"""Format-aware GSM8K reward (verl signature): 1.0 for the right ``#### n``, 0.1 for the format with a wrong
number, 0 without ``####``. A 135M model starts near 0 on strict GSM8K (see README), so the format term gives
GRPO groups with varied rewards from the first step."""

from core.rewards.gsm8k import compute_score as gsm8k_score, extract_answer


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    pred = extract_answer(solution_str, "strict")
    score = gsm8k_score(solution_str, ground_truth, method="strict", format_score=0.1)
    return {"score": score, "acc": score == 1.0, "pred": pred or ""}
