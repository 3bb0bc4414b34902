"""GSM8K: the answer is the number after the last ``####`` (strict) or the last number in the text (flexible).

Extraction as verl's ``gsm8k.compute_score`` (its regexes; commas and ``$`` dropped), with these differences, each
a case where verl is wrong or misses a right answer:

- the whole response is searched (verl: its last 300 characters, so a right ``#### 42`` followed by an explanation
  scored 0); every pattern is linear, and the strict marker is found with ``rfind``;
- numbers compare by value, exactly (``core.rewards.numbers``): ``#### 72.00`` is right for 72 (verl compares
  strings), ``#### 18.0000001`` is not;
- strict: a ``#### n`` line that goes on with another number is a hedge (``#### 3 or 4``, ``#### 3, 4``) and has no
  answer; a comma is a thousands separator only in groups of three (verl reads ``3,4`` as 34).
"""

from __future__ import annotations

import re

from core.rewards.numbers import matches, parse_number

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")
_THOUSANDS = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d*)?")
MAX_LINE_CHARS = 2_000


def _clean(token: str) -> str:
    return token.replace("$", "").rstrip(".").rstrip(",")


def extract_answer(text: str, method: str = "strict") -> str | None:
    """The final answer string, or None. strict: the number after the last ``#### `` (None when the rest of its
    line holds another number); flexible: the last number-like token. Examples: '... #### 1,000' -> '1000';
    '#### 3 or 4' -> None; 'first 3, then 17.' -> '17' (flexible)."""
    if method == "strict":
        i = text.rfind("#### ")
        if i < 0:
            return None
        end = text.find("\n", i)
        line = text[i:end if end >= 0 else min(len(text), i + MAX_LINE_CHARS)]
        m = _STRICT.match(line)
        if not m or any(c.isdigit() for c in line[m.end():]):
            return None
        token = _clean(m.group(1))
        if "," in token and not _THOUSANDS.fullmatch(token):  # '3,4' is a list, not 34
            return None
        return token.replace(",", "") if any(c.isdigit() for c in token) else None
    if method == "flexible":
        for m in reversed(_NUMBER.findall(text)):
            tok = _clean(m).replace(",", "")
            if tok and tok not in ("-", "."):
                return tok
        return None
    raise ValueError(f"gsm8k method must be 'strict' or 'flexible', got {method!r}")


def _same_number(answer: str, gold: str) -> bool:
    a, g = parse_number(answer), parse_number(gold)
    if a is None or g is None:
        return answer == gold
    return matches(a, g)


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
