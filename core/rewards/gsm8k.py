"""GSM8K: the answer is the number after ``####`` (strict) or the last number in the text (flexible).

Matches verl's ``gsm8k.compute_score``: commas and ``$`` are dropped before comparing; a response longer than
``max_chars`` is only searched in its tail (a runaway response cannot stall the regex).
"""

from __future__ import annotations

import re

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")


def extract_answer(text: str, method: str = "strict", max_chars: int = 300) -> str | None:
    """The final answer string, or None. strict: the last ``#### n``; flexible: the last number-like token."""
    text = text[-max_chars:] if max_chars and len(text) > max_chars else text
    if method == "strict":
        found = _STRICT.findall(text)
        return found[-1].replace(",", "").replace("$", "").rstrip(".") if found else None
    if method == "flexible":
        for tok in reversed(_NUMBER.findall(text)):
            tok = tok.replace(",", "").rstrip(".")
            if tok and tok not in ("-", "."):
                return tok
        return None
    raise ValueError(f"gsm8k method must be 'strict' or 'flexible', got {method!r}")


def _same_number(a: str, b: str) -> bool:
    try:
        return abs(float(a) - float(b)) < 1e-6
    except ValueError:
        return a == b


def compute_score(solution_str: str, ground_truth: str, method: str = "strict", format_score: float = 0.0,
                  score: float = 1.0) -> float:
    """``score`` if the extracted answer equals the ground truth, ``format_score`` if an answer was found but is
    wrong, 0 if none was found. Example: ("... #### 1,000", "1000") -> 1.0; ("it is 12", "12") -> 0 strict, 1 flexible."""
    answer = extract_answer(solution_str, method)
    if answer is None:
        return 0.0
    return score if _same_number(answer, str(ground_truth).replace(",", "")) else format_score


def ground_truth_from_solution(answer_field: str) -> str:
    """The gold number of a GSM8K record's ``answer`` field (the text after the final ``####``)."""
    if "####" not in answer_field:
        raise ValueError("GSM8K answer has no '####'")
    return answer_field.split("####")[-1].strip().replace(",", "")
