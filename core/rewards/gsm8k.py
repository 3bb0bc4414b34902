"""GSM8K: the answer is the number after the last ``####`` (strict) or the last number in the text (flexible).

Extraction as verl's ``gsm8k.compute_score`` (its regexes; commas and ``$`` dropped), with these differences, each
a case where verl is wrong or misses a right answer:

- the whole response is searched (verl: its last 300 characters, so a right ``#### 42`` followed by an explanation
  scored 0); every pattern is linear, and the strict marker is found with ``rfind``;
- numbers compare by value, exactly (``core.rewards.numbers``): ``#### 72.00`` is right for 72 (verl compares
  strings), ``#### 18.0000001`` is not;
- flexible: the last number, unless it ends a list or an alternative (``3, 2``, ``3 or 2``: a hedge, no answer);
- strict: a ``#### n`` line that goes on with another number is a hedge (``#### 3 or 4``, ``#### 3, 4``) and has no
  answer, and so is a response whose ``#### `` lines give different values; a comma is a thousands separator only
  in groups of three (verl reads ``3,4`` as 34); ``#### 3e5`` is 300000 (verl reads 3).
"""

from __future__ import annotations

import re

from core.rewards.numbers import THOUSANDS, matches, parse_number

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")
_EXPONENT = re.compile(r"(?:[eE]([+-]?\d{1,4})|\s?(?:\\times|\\cdot|×)\s?10\^\{?([+-]?\d{1,4})\}?)")
MAX_LINE_CHARS = 2_000
MAX_MARKERS = 8  # the last '#### ' lines compared for a hedge


def _clean(token: str) -> str:
    return token.replace("$", "").rstrip(".").rstrip(",")


def _is_list(token: str) -> bool:
    """'3,4' is a list, not 34: a comma separates thousands only in groups of three."""
    return "," in token and not THOUSANDS.fullmatch(token)


def _strict_at(text: str, i: int) -> str | None:
    """The number of the ``#### `` line at ``i`` (a trailing ``e5`` / ``\\times 10^{5}`` read with it), or None:
    no number, or another number later on the line (a hedge: ``#### 3 or 4``, ``#### 3, 4``)."""
    end = text.find("\n", i)
    line = text[i:end if end >= 0 else min(len(text), i + MAX_LINE_CHARS)]
    m = _STRICT.match(line)
    if not m:
        return None
    token, rest = _clean(m.group(1)), line[m.end():]
    e = _EXPONENT.match(rest) if not m.group(1).endswith((".", ",")) else None
    if e:
        token, rest = f"{token}e{e.group(1) or e.group(2)}", rest[e.end():]
    if any(c.isdigit() for c in rest) or _is_list(token):
        return None
    return token.replace(",", "") if any(c.isdigit() for c in token) else None


def extract_answer(text: str, method: str = "strict") -> str | None:
    """The final answer string, or None. strict: the number after the last ``#### `` -- None when the rest of its
    line holds another number, or when an earlier ``#### `` line (of the last ``MAX_MARKERS``) gave another value;
    flexible: the last number-like token, None when it ends a list or an alternative. Examples: '... #### 1,000'
    -> '1000'; '#### 3 or 4' -> None; '#### 3\\n#### 4' -> None; 'first 3, then 17.' -> '17' (flexible);
    'it is 3 or 4' -> None (flexible)."""
    if method == "strict":
        answers, end = [], len(text)
        while len(answers) < MAX_MARKERS and (i := text.rfind("#### ", 0, end)) >= 0:
            answers.append(_strict_at(text, i))
            end = i
        answers = [a for a in answers if a is not None] if answers and answers[0] is not None else []
        if not answers or any(not _same_number(a, answers[0]) for a in answers[1:]):
            return None
        return answers[0]
    if method == "flexible":
        last = previous = None
        for m in _NUMBER.finditer(text):  # linear; keeps the last two number tokens
            if any(c.isdigit() for c in m.group()):
                last, previous = m, last
        if last is None:
            return None
        tok = _clean(last.group())
        if _is_list(tok):
            return None
        if previous is not None:  # '3 or 2', '3, 2', '3 \text{ or } 2': a hedge
            sep = ("," if previous.group().endswith(",") else "") + text[previous.end():last.start()]
            if re.sub(r"\s|\\text\{|\}", "", sep).lower() in (",", "or", ",or", ";") and \
                    not _same_number(_clean(previous.group()).replace(",", ""), tok.replace(",", "")):
                return None
        return tok.replace(",", "")
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
