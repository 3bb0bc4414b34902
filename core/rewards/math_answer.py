"""MATH-style answers: ``\\boxed{...}`` extraction, normalisation and equivalence; DAPO's ``Answer:`` line.

Two answers are equal when (1) their normal forms match (Hendrycks MATH ``strip_string`` conventions: units, ``$``,
``\\left``/``\\right``, degrees, percent, ``\\frac12``, ``a/b``, thousands separators), or (2) both read as numbers
that match by ``core.rewards.numbers.matches`` (exact for integers and fractions, to the gold's written precision
for decimals and scientific notation), or (3) ``math-verify`` (optional, the ``math`` extra) finds them equal in
both directions from complete LaTeX parses -- unless ``core.rewards.equations.differ`` first shows values that
differ at a point or equations with different solutions (a wrong symbolic answer rejected in ~0.1 ms instead of math-verify's ~100 ms). The fallback only
widens what is equal: it never runs on two numbers (the exact rule decides), sees only answers of at most
``MAX_VERIFY_CHARS``, takes no partial parse (math-verify's first-match fallback read ``-1./3+1`` as ``-1``) and no
numeral with a base subscript (it reads ``1011_2`` as 1011).
A non-number against a gold given to a precision is evaluated and held to that precision.

Hedges score wrong: a response whose boxes hold different answers (``\\boxed{3} ... \\boxed{4}``) has no answer.
Every function here is linear in its input: boxes are searched from the end with ``rfind``, each box's content is
read at most ``MAX_ANSWER_CHARS`` far, at most ``MAX_BOXES`` boxes are compared, and no regex has nested quantifiers.
"""

from __future__ import annotations

import collections
import functools
import re
import threading
from fractions import Fraction

from core.rewards.equations import differ
from core.rewards.numbers import THOUSANDS, Number, matches, parse_number

MAX_ANSWER_CHARS = 2_000   # a box or Answer: line longer than this holds no answer
MAX_BOXES = 8              # the last boxes compared for a hedge
MAX_VERIFY_CHARS = 300     # math-verify's parser is super-linear: longer answers compare as text and numbers only
VERIFY_S = 2               # math-verify's own limit per parse / comparison (its SIGALRM; main thread only): sympy
                           # took 10 s to tell two ODEs apart; slower than this reads as "not shown equal"
_BRACE = re.compile(r"[{}]")


def _box_at(text: str, i: int) -> tuple[str, int] | None:
    """The content of the box whose command starts at ``i`` and where it ends, or None (unbalanced, too long)."""
    j = text.find("{", i, i + 8)
    if j < 0 or text[i:j].strip() not in ("\\boxed", "\\fbox"):  # "\boxed 5"
        m = re.match(r"\\(?:boxed|fbox) +([^\s$]{1,100})", text[i:i + 120])
        return (m.group(1), i + m.end()) if m else None
    depth = 0
    for m in _BRACE.finditer(text, j, j + MAX_ANSWER_CHARS):
        depth += 1 if m.group() == "{" else -1
        if depth == 0:
            return text[j + 1:m.start()], m.start()
    return None


def boxed_answers(text: str, limit: int = MAX_BOXES) -> list[str]:
    """The contents of the last ``limit`` boxes (``\\boxed{}``, ``\\fbox{}``, ``\\boxed 5``), last first; a box that
    wraps a later one (``\\boxed{\\boxed{3}}``) is not counted again, an unbalanced one not at all. At most
    ``2 * limit`` box commands are read, from the end."""
    found, end, inner_start = [], len(text), None
    for _ in range(2 * limit):  # bounded work: a run of unbalanced or nested boxes is not read to its start
        if len(found) == limit or end <= 0:
            break
        i = max(text.rfind("\\boxed", 0, end), text.rfind("\\fbox", 0, end))
        if i < 0:
            break
        box = _box_at(text, i)
        if box is not None and (inner_start is None or box[1] < inner_start):
            found.append(box[0])
            inner_start = i
        end = i
    return found


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (braces balanced), or of ``\\boxed x``; else None."""
    boxes = boxed_answers(text, limit=1)
    return boxes[0] if boxes else None


def _fix_fracs(s: str) -> str:
    parts = s.split("\\frac")
    out = [parts[0]]
    for part in parts[1:]:
        if part.startswith("{") or len(part) < 2:
            out.append("\\frac" + part)
        else:  # \frac12 -> \frac{1}{2}, \frac1{2} -> \frac{1}{2}
            a, b, tail = part[0], part[1], part[2:]
            out.append(f"\\frac{{{a}}}{{{b}}}{tail}" if b != "{" else f"\\frac{{{a}}}{b}{tail}")
    return "".join(out)


_UNITS = re.compile(r" ?(?:dollars?|cents?|units?|cm|meters?|inches|degrees|km|kg|hours?|minutes?|mph|feet|ft)$")


def normalize(s: str) -> str:
    """A canonical string for a final answer. Example: '\\$1,000.00 \\text{ dollars}' -> '1000'."""
    s = " ".join(str(s).split()).rstrip(".")  # one space per run: every later pattern meets runs of length 1
    for old, new in (("\\!", ""), ("\\,", ""), ("{,}", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"),
                     ("\\left", ""), ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", ""), ("$", ""),
                     ("\\%", ""), ("%", ""), ("−", "-"), ("\\displaystyle", "")):
        s = s.replace(old, new)
    s = re.sub(r"\\(?:text|textbf|mbox|mathrm) ?\{([^{}]*)\}", r"\1", s).strip()
    s = re.sub(r"_\{(\w)\}", r"_\1", s)  # 1011_{2} -> 1011_2
    s = _UNITS.sub("", s).strip()
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    if re.fullmatch(r"[a-zA-Z] ?= ?[^=]+", s):  # "x = 5" -> "5"
        s = s.split("=", 1)[1]
    s = _fix_fracs(s.replace(" ", ""))
    if re.fullmatch(r"-?\d+/\d+", s):
        a, b = s.split("/")
        s = f"\\frac{{{a}}}{{{b}}}"
    if THOUSANDS.fullmatch(s):  # 1,000 -> 1000 (not a tuple "1,2")
        s = s.replace(",", "")
    if re.fullmatch(r"-?\d+\.0*", s):
        s = s.split(".")[0]
    return s


def _limit() -> int | None:
    """math-verify's time limit where its alarm can work (a reward worker's main thread), else None: off the main
    thread signal() would raise, and the reward worker's kill (``core.rewards.scoring``) bounds the call anyway."""
    return VERIFY_S if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=65536)
def _latex(s: str):
    """math-verify's complete parse of ``s`` (LaTeX only, no first-match fallback), or None; cached, so a gold is
    parsed once per process. None also when math-verify is not installed or the text is not safe to give it."""
    if len(s) > MAX_VERIFY_CHARS or re.search(r"\d_", s):
        return None
    try:
        from math_verify import LatexExtractionConfig, parse
        from sympy import nan, zoo
    except ImportError:
        return None
    try:
        parsed = parse(f"${s}$", extraction_config=[LatexExtractionConfig()], fallback_mode="no_fallback",
                       parsing_timeout=_limit())
        if not parsed or any(getattr(e, "has", lambda *_: False)(zoo, nan) for e in parsed[:1]):
            return None  # no parse, or one read as undefined (\gamma^{2} is zoo**2 there): compared as text only
    except Exception:
        return None
    return parsed


def _verified(a: str, b: str) -> bool:
    """math-verify calls gold ``b`` and ``a`` equal both ways; the gold is parsed first (once, cached): when it has
    no parse, the answer is not parsed at all."""
    pb = _latex(b)
    pa = _latex(a) if pb is not None else None
    if pa is None or pb is None:
        return False
    from math_verify import verify
    try:
        return bool(verify(pa, pb, timeout_seconds=_limit())) and bool(verify(pb, pa, timeout_seconds=_limit()))
    except Exception:
        return False


def _value(s: str) -> Number | None:
    """The exact value of a closed-form answer math-verify reads (``\\sqrt{2}``, ``2\\pi``), to 40 digits."""
    parsed = _latex(s)
    try:
        expr = parsed[0] if parsed else None
        if expr is None or getattr(expr, "free_symbols", {1}) or not expr.is_number or not expr.is_real:
            return None
        return Number(Fraction(str(expr.evalf(40))))
    except Exception:
        return None


def _math(s: str) -> str:
    """The LaTeX of an answer: outer ``$`` off, spaces kept, one formula across ``A+$ $B`` (two math regions joined
    by a space, of which math-verify would read only ``B``)."""
    return re.sub(r"\$\s*\$", " ", s.strip().strip("$").strip())


def is_equiv(pred: str | None, gold: str, use_math_verify: bool = True) -> bool:
    """Is the answer ``pred`` equal to ``gold`` (module docstring). Examples: ('\\frac12', '0.5') -> True;
    ('0', '7.4e-12') -> False; ('3.14159', '3.14') -> True; ('-1./3+1', '-1./3') -> False."""
    if pred is None:
        return False
    a, b = normalize(pred), normalize(gold)
    if a == b:
        return a != ""
    x, y = parse_number(a), parse_number(b)
    if x is not None and y is not None:
        return matches(x, y)
    if not use_math_verify:
        return False
    pred, gold = _math(pred), _math(str(gold))
    if y is not None and y.unit is not None:  # a gold given to a precision: the answer's value, held to it
        v = _value(pred)
        return v is not None and matches(v, y)
    if differ(pred, gold):  # both evaluate and differ at a point: math-verify could not call them equal (fast)
        return False
    if x is not None and (v := _value(gold)) is not None:  # a number against a closed form (\sqrt{2}): exactly
        return x.unit is None and _verified(pred, gold) or x.value == v.value
    return _verified(pred, gold)


def boxed_answer(text: str) -> str | None:
    """The response's boxed answer: the last box, provided every earlier box (of the last ``MAX_BOXES``) holds an
    equal answer; None for no box or a hedge. Example: '\\boxed{1/2} so \\boxed{0.5}' -> '0.5';
    '\\boxed{3} or \\boxed{4}' -> None."""
    boxes = boxed_answers(text)
    if not boxes:
        return None
    last = boxes[0]
    if any(not is_equiv(b, last) for b in boxes[1:]):
        return None
    return last


def compute_score(solution_str: str, ground_truth: str, use_math_verify: bool = True) -> float:
    """1.0 if the boxed answer equals the ground truth, else 0.0 (no box, or boxes that disagree: 0).
    Example: ('so \\boxed{\\frac{1}{2}}', '0.5') -> 1.0; ('no box', '3') -> 0.0."""
    return 1.0 if is_equiv(boxed_answer(solution_str), ground_truth, use_math_verify) else 0.0


_ANSWER = re.compile(r"(?i)answer[ \t]*:")


def _line_after(text: str, m: re.Match) -> str | None:
    end = text.find("\n", m.end())
    line = text[m.end():end if end >= 0 else len(text)]
    if len(line) > MAX_ANSWER_CHARS:
        return None
    ans = line.strip().rstrip(".").strip("$ ")
    return boxed_answer(ans) or ans or None


def extract_answer_colon(text: str) -> str | None:
    """DAPO format: the text after the last ``Answer:`` to the end of its line (a ``\\boxed{}`` inside it is
    unwrapped); None without one, for a line longer than ``MAX_ANSWER_CHARS``, or for a hedge: an earlier
    ``Answer:`` line (of the last ``MAX_BOXES``) with another answer. Example: 'Answer: 3\\nAnswer: 4' -> None."""
    found = collections.deque(_ANSWER.finditer(text), maxlen=MAX_BOXES)
    if not found:
        return None
    answers = [_line_after(text, m) for m in reversed(found)]
    if answers[0] is None or any(a is not None and not is_equiv(a, answers[0]) for a in answers[1:]):
        return None
    return answers[0]


def compute_score_dapo(solution_str: str, ground_truth: str) -> dict:
    """DAPO-Math reward: +1 correct / -1 incorrect, as the DAPO paper's rule-based reward and verl's ``math_dapo``:
    the answer is the last ``Answer:`` line, or without one the boxed answer (verl's fallback). Returns verl's dict
    form: {"score", "acc", "pred"}. Examples: ('... Answer: 34', '34') -> score 1, acc True;
    ('... so \\boxed{34}', '34') -> score 1; ('... Answer: 33', '34') -> score -1."""
    pred = extract_answer_colon(solution_str)
    if pred is None:
        pred = boxed_answer(solution_str)
    ok = is_equiv(pred, ground_truth)
    return {"score": 1.0 if ok else -1.0, "acc": ok, "pred": pred or ""}
