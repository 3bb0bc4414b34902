"""MATH-style answers: ``\\boxed{...}`` extraction (nested braces), normalisation and equivalence; DAPO's ``Answer:``.

Normalisation follows the Hendrycks MATH ``strip_string`` conventions (units, ``$``, ``\\left``/``\\right``,
degrees, percent, ``\\frac12`` -> ``\\frac{1}{2}``, ``a/b`` -> ``\\frac{a}{b}``, thousands separators), then two
answers are equal if their normal forms match or both parse to numbers within 1e-6 (relative). When the
optional ``math-verify`` package is installed, a pair that still differs gets a second, symbolic opinion.
"""

from __future__ import annotations

import re
from fractions import Fraction


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (braces balanced), or of ``\\boxed x``; else None."""
    i = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if i < 0:
        return None
    j = text.index("{", i) if "{" in text[i:i + 8] else -1
    if j < 0:  # "\boxed 5"
        m = re.match(r"\\(?:boxed|fbox)\s+([^\s$]+)", text[i:])
        return m.group(1) if m else None
    depth = 0
    for k in range(j, len(text)):
        depth += {"{": 1, "}": -1}.get(text[k], 0)
        if depth == 0:
            return text[j + 1:k]
    return None  # unbalanced: no answer


def _fix_fracs(s: str) -> str:
    out, rest = "", s.split("\\frac")
    out = rest[0]
    for part in rest[1:]:
        out += "\\frac"
        if part.startswith("{") or len(part) < 2:
            out += part
        else:  # \frac12 -> \frac{1}{2}, \frac1{2} -> \frac{1}{2}
            a, b, tail = part[0], part[1], part[2:]
            out += f"{{{a}}}{{{b}}}{tail}" if b != "{" else f"{{{a}}}{b}{tail}"
    return out


def normalize(s: str) -> str:
    """A canonical string for a final answer. Example: '\\$1,000.00 \\text{ dollars}' -> '1000'."""
    s = str(s).strip().replace("\n", "").rstrip(".")
    s = s.replace("\\!", "").replace("\\\\", "\\").replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "").replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = re.sub(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\s*(?:dollars?|cents?|units?|cm|meters?|inches|degrees|km|kg|hours?|minutes?|mph|feet|ft)\s*$", "", s)
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    if re.fullmatch(r"[a-zA-Z]\s*=\s*.+", s):  # "x = 5" -> "5"
        s = s.split("=", 1)[1]
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if re.fullmatch(r"-?\d+/\d+", s):
        a, b = s.split("/")
        s = f"\\frac{{{a}}}{{{b}}}"
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):  # 1,000 -> 1000 (not a tuple "1,2")
        s = s.replace(",", "")
    if re.fullmatch(r"-?\d+\.0*", s):
        s = s.split(".")[0]
    return s


def to_number(s: str) -> float | None:
    """A float for plain numbers, decimals and \\frac{a}{b} / -\\frac{a}{b}; else None."""
    m = re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}", s)
    if m:
        return (-1 if m.group(1) else 1) * float(Fraction(int(m.group(2)), int(m.group(3)))) if int(m.group(3)) else None
    try:
        return float(s)
    except ValueError:
        return None


def is_equiv(pred: str | None, gold: str, use_math_verify: bool = True) -> bool:
    if pred is None:
        return False
    a, b = normalize(pred), normalize(gold)
    if a == b:
        return True
    x, y = to_number(a), to_number(b)
    if x is not None and y is not None:
        return abs(x - y) <= 1e-6 * max(1.0, abs(y))
    if use_math_verify:
        try:
            from math_verify import parse, verify
        except ImportError:
            return False
        try:
            return bool(verify(parse(f"${gold}$"), parse(f"${pred}$")))
        except Exception:
            return False
    return False


def compute_score(solution_str: str, ground_truth: str, use_math_verify: bool = True) -> float:
    """1.0 if the last ``\\boxed{}`` answer equals the ground truth, else 0.0.
    Example: ('so \\boxed{\\frac{1}{2}}', '0.5') -> 1.0; ('no box', '3') -> 0.0."""
    return 1.0 if is_equiv(last_boxed(solution_str), ground_truth, use_math_verify) else 0.0


_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")


def extract_answer_colon(text: str, max_chars: int = 300) -> str | None:
    """DAPO format: the text after the last ``Answer:`` (a ``\\boxed{}`` inside it is unwrapped)."""
    found = _ANSWER.findall(text[-max_chars:])
    if not found:
        return None
    ans = found[-1].strip().rstrip(".").strip("$ ")
    return last_boxed(ans) or ans


def compute_score_dapo(solution_str: str, ground_truth: str) -> dict:
    """DAPO-Math reward: +1 correct / -1 incorrect (or no ``Answer:``), as the DAPO paper's rule-based reward.
    Returns verl's dict form: {"score", "acc", "pred"}. Example: ('... Answer: 34', '34') -> score 1, acc True."""
    pred = extract_answer_colon(solution_str)
    ok = is_equiv(pred, ground_truth)
    return {"score": 1.0 if ok else -1.0, "acc": ok, "pred": pred or ""}
