"""Format-aware GSM8K reward (verl signature): 1.0 for the right ``#### n``, 0.1 for the format with a wrong
number, 0 without ``####``. A 135M model starts near 0 on strict GSM8K (see README), so the format term gives
GRPO groups with varied rewards from the first step."""

import re

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    found = _STRICT.findall(solution_str[-300:])
    if not found:
        return {"score": 0.0, "acc": False, "pred": ""}
    pred = found[-1].replace(",", "").rstrip(".")
    try:
        ok = abs(float(pred) - float(str(ground_truth).replace(",", ""))) < 1e-6
    except ValueError:
        ok = False
    return {"score": 1.0 if ok else 0.1, "acc": ok, "pred": pred}
