"""Numbers in final answers, read exactly: integers, decimals, fractions and scientific notation as ``Fraction``s.

The comparison rule (``matches``), relative to the gold's own digits, never an absolute epsilon:

- an integer, a fraction, or a power of ten times an integer is exact (``72``, ``3e6``, ``\\frac{3}{6}``, ``1/2``,
  ``10^{5}``): an answer is right only when it has exactly that value (``0.5`` is right for ``1/2``; ``0.3333333``
  is not right for ``1/3``; ``3000001`` is not right for ``3e6``; ``2e-8`` is not right for ``1e-8``);
- a gold written as a decimal, or in scientific notation with a decimal point (``3.14``, ``7.4e-12``,
  ``8.49 \\times 10^{-4}``), is taken as given to its written precision ``u`` (one unit of its last written digit),
  and an answer is right when it rounds to the gold at that precision: ``|answer - gold| <= u / 2``. Gold ``3.14``:
  ``3.14159`` right, ``3.15`` wrong; gold ``7.4e-12``: ``7.41e-12`` right, ``0`` and ``8e-12`` wrong. A plain
  decimal whose fractional digits are all zeros (``72.00``, a float gold's ``27.0``) is the integer it writes;
- a closed form that is not a plain number (``\\sqrt{2}``, ``3\\pi``) is exact too: ``1.41421356`` is not right for
  ``\\sqrt{2}`` (``core.rewards.math_answer``).

Two numbers written to the same precision match in both directions (the rule is symmetric there). Parsing is
bounded: a mantissa of more than ``MAX_DIGITS`` digits or an exponent beyond ``MAX_EXPONENT`` is not read as a
number (it compares as text), so no input reaches Python's int-digit limit or builds a huge integer. ``_`` is never
a digit separator (``1011_2`` is a base-2 numeral, not 10112); ``,`` separates thousands only in groups of three.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

MAX_DIGITS = 200
MAX_EXPONENT = 400

_DECIMAL = r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d*)?"
THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d*)?")  # '1,000' and '1,000.5'; not the list '1,2'
_PLAIN = re.compile(rf"({_DECIMAL})(?:[eE]([+-]?\d+))?")
# mantissa \times 10^{e} (also \cdot, ×, *; braces optional); 10^{e} alone
_SCI = re.compile(rf"(?:({_DECIMAL})(?:\\times|\\cdot|×|\*))?10\^(?:\{{([+-]?\d+)\}}|([+-]?\d))")
_FRAC = re.compile(r"([+-]?)\\frac\{([^{}]*)\}\{([^{}]*)\}")
_SLASH = re.compile(r"([^/]+)/([^/]+)")


@dataclass(frozen=True)
class Number:
    """A parsed number: its exact ``value`` and ``unit``, one unit of its last written digit (None: exact)."""
    value: Fraction
    unit: Fraction | None = None


def _digits_ok(text: str, exponent: str | None) -> bool:
    if exponent is not None and (len(exponent) > 6 or abs(int(exponent)) > MAX_EXPONENT):
        return False
    return sum(c.isdigit() for c in text) <= MAX_DIGITS


def _decimal(mantissa: str, exponent: str | None) -> Number | None:
    """``mantissa`` (digits, optional sign, point and thousands commas) times 10^``exponent``."""
    if not any(c.isdigit() for c in mantissa) or not _digits_ok(mantissa, exponent):
        return None
    sign = -1 if mantissa.startswith("-") else 1
    whole, _, frac = mantissa.lstrip("+-").replace(",", "").partition(".")
    exp = int(exponent) if exponent is not None else 0
    scale = 10 ** len(frac)
    value = sign * Fraction(int(whole or "0") * scale + int(frac or "0"), scale) * Fraction(10) ** exp
    # a mantissa with a decimal point is given to its written digits (7.40e-12: to 1e-14); without one the number
    # is an integer times a power of ten, exact (3e6 is 3000000); a plain decimal whose fractional digits are all
    # zeros writes an integer too (72.00, a float gold's 27.0)
    inexact = "." in mantissa if exponent is not None else frac.strip("0") != ""
    return Number(value, Fraction(10) ** (exp - len(frac)) if inexact else None)


def parse_number(s: str) -> Number | None:
    """The number a normalised answer writes (no spaces, no ``$``), or None when it is not exactly one number.
    Examples: '72' -> 72 exact; '-\\frac{1}{3}' -> -1/3 exact; '1/3' -> 1/3 exact; '3.14' -> 157/50 to 1/100;
    '8.49\\times10^{-4}' -> 849/1000000 to 1/1000000; '3e6' -> 3000000 exact; '1,000' -> 1000; '1011_2' -> None;
    '1,2' -> None."""
    if len(s) > 2 * MAX_DIGITS + 40:
        return None
    m = _PLAIN.fullmatch(s)
    if m:
        return _decimal(m.group(1), m.group(2))
    m = _SCI.fullmatch(s)
    if m:
        exponent = m.group(2) or m.group(3)
        if m.group(1) is None:
            return Number(Fraction(10) ** int(exponent)) if _digits_ok("", exponent) else None
        return _decimal(m.group(1), exponent)
    m = _FRAC.fullmatch(s) or _SLASH.fullmatch(s)
    if m:
        sign, num, den = m.groups() if len(m.groups()) == 3 else ("", *m.groups())
        a, b = parse_number(num), parse_number(den)
        if a is None or b is None or b.value == 0 or "/" in num + den or "\\frac" in num + den:
            return None
        return Number((-1 if sign == "-" else 1) * a.value / b.value)  # a fraction is exact as written
    return None


def matches(answer: Number, gold: Number) -> bool:
    """Is ``answer`` right for ``gold``: exactly equal to an exact gold, or within half a unit of the gold's last
    written digit. Example: matches(3.14159, 3.14 to 1/100) -> True; matches(0.3333333, 1/3 exact) -> False."""
    if gold.unit is None:
        return answer.value == gold.value
    return abs(answer.value - gold.value) * 2 <= gold.unit
