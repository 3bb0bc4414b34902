"""Numbers as the reward-scorer tests label them (``answers.py``'s rule): ``read_number`` gives a gold's exact value
and, for a decimal, the places it was written to; ``is_right`` judges an answer's value against it; ``dec``, ``sci``,
``fixed``, ``latex_frac`` and ``canonical`` write a value the ways a policy might."""

from __future__ import annotations
import decimal
import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

@dataclass(frozen=True)
class Num:
    value: Fraction
    places: int | None  # None: exact; else decimal places the gold was written to (negative for 4.5e33)
    mantissa: str = ""  # for decimal golds: the written mantissa ("7.4" of 7.4e-12)
    exp: int = 0        # and exponent


_INT = re.compile(r"[+-]?\d+")
_DEC = re.compile(r"[+-]?(\d+\.\d+|\.\d+)")
_SCI = re.compile(r"([+-]?\d+(?:\.\d+)?)\s*(?:[eE]\s*([+-]?\d+)|\\times\s*10\^\{?([+-]?\d+)\}?)")
_FRAC = re.compile(r"([+-]?)\\[dt]?frac\{([+-]?\d+)\}\{(\d+)\}")
_SLASH = re.compile(r"([+-]?\d+)\.?\s*/\s*(\d+)\.?")


def read_number(s: str) -> Num | None:
    """The value (and written precision) of a numeric gold; None for anything symbolic."""
    s = s.strip()
    if _INT.fullmatch(s):
        return Num(Fraction(int(s)), None)
    if _DEC.fullmatch(s):
        frac = s.split(".")[1]
        if not frac.strip("0"):  # 72.00, a float gold's 27.0: the integer it writes
            return Num(Fraction(Decimal(s)), None)
        return Num(Fraction(Decimal(s)), len(frac), s, 0)
    m = _SCI.fullmatch(s)
    if m:
        mant, exp = m.group(1), int(m.group(2) or m.group(3))
        value = Fraction(Decimal(mant)) * Fraction(10) ** exp
        if "." in mant:
            return Num(value, len(mant.split(".")[1]) - exp, mant, exp)
        return Num(value, None, mant, exp)
    m = _FRAC.fullmatch(s)
    if m and int(m.group(3)):
        return Num(Fraction(int(m.group(2)), int(m.group(3))) * (-1 if m.group(1) == "-" else 1), None)
    m = _SLASH.fullmatch(s)
    if m and int(m.group(2)):
        return Num(Fraction(int(m.group(1)), int(m.group(2))), None)
    return None


def is_right(gold: Num, answer: Fraction) -> bool:
    """The labelling rule for numbers (module docstring)."""
    if gold.places is None:
        return answer == gold.value
    return abs(answer - gold.value) <= Fraction(1, 2) * Fraction(10) ** (-gold.places)




def dec(x: Fraction) -> str | None:
    """The exact, shortest decimal string of ``x``; None when it does not terminate."""
    d = x.denominator
    k2 = k5 = 0
    while d % 2 == 0:
        d //= 2
        k2 += 1
    while d % 5 == 0:
        d //= 5
        k5 += 1
    if d != 1:
        return None
    k = max(k2, k5)
    n = x * 10 ** k
    assert n.denominator == 1
    with decimal.localcontext() as ctx:
        ctx.prec = 400
        s = format(Decimal(int(n)).scaleb(-k), "f")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def sci(x: Fraction) -> tuple[str, int] | None:
    """(mantissa, exponent) with 1 <= |mantissa| < 10, exact; None for 0 or a non-terminating x."""
    s = dec(x)
    if s is None or x == 0:
        return None
    t = Decimal(s).normalize().as_tuple()
    digits = "".join(map(str, t.digits))
    exp = len(digits) - 1 + t.exponent
    mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return ("-" if t.sign else "") + mant, exp


def fixed(x: Fraction, places: int) -> str:
    """``x`` rounded to ``places`` decimals (places may be negative), written plainly."""
    r = round(x * Fraction(10) ** places) * Fraction(10) ** (-places)  # exact, half to even
    if places > 0:
        return format(Decimal(r.numerator) / Decimal(r.denominator), f".{places}f")
    return str(int(r))


def latex_frac(x: Fraction) -> str:
    if x.denominator == 1:
        return str(x.numerator)
    sign = "-" if x < 0 else ""
    return f"{sign}\\frac{{{abs(x.numerator)}}}{{{x.denominator}}}"


def canonical(x: Fraction) -> str:
    """A plain way to write an exact value: an integer, a terminating decimal, else \\frac."""
    return dec(x) if dec(x) is not None else latex_frac(x)
