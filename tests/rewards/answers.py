"""Generated answers for the reward-scorer tests: for a gold answer, EQUIVALENT and NON-EQUIVALENT answer forms,
wrapped in each data source's response format, each with its known label. Deterministic (seeded), no network.

The labels follow one rule for numbers (``is_right``):

- a gold written as an integer, a fraction or an expression of them (``72``, ``\\frac{1}{3}``, ``-1./3``, ``3e6``) is
  EXACT: an answer is right only when its value is that number exactly -- a decimal written by the policy is taken
  at its face value (``0.3333333`` is not ``1/3``; ``3000001`` is not ``3e6``; ``72.0000072`` is not ``72``);
- a gold written as a decimal (``3.14``, ``0.10``, ``7.4e-12``, ``8.49 \\times 10^{-4}``: a decimal point in the
  mantissa) is taken to its written precision: an answer is right when it rounds to the gold at that precision
  (gold ``3.14``: ``3.14159`` right, ``3.15`` wrong; gold ``7.4e-12``: ``7.41e-12`` right, ``8e-12`` and ``0`` wrong);
  a plain decimal whose fractional digits are all zeros (``27.0``) is the integer it writes.
  Generated answers stay clear of the rounding boundary (at most 0.49 of a unit in the last place away).

Symbolic golds get forms whose equivalence holds by construction (same expression, spacing, ``\\dfrac``, ...).
Hedges (``3 \\text{ or } 4``, ``3, 4``, intervals, two boxes, "the answer is 3 or 4") are never right: no gold here
is that set.

Data: ``../shared/data/<name>/test.jsonl`` next to the repository (``DATA_DIR``), read in place, never copied.
``data_missing(name)`` says why a data set cannot be used (tests skip with it). ``SYNTHETIC`` adds MATH-style golds
the four data sets lack (fractions, radicals, intervals, base-2 numerals, lists), generated from a fixed seed.

Used by test_math_verify_differential.py, test_verl_differential.py, test_hacking_probe.py, bench/reward_tables.py;
the scorers under test and the references (verl, math-verify) are in ``references.py``.
"""

from __future__ import annotations

import decimal
import json
import random
import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data"
DATASETS = ("gsm8k", "minerva_math", "aime24", "amc23")
ALL_SETS = DATASETS + ("synthetic",)
SEED = 20240917


# ----------------------------------------------------------------------------------------------------------- data

def data_missing(name: str) -> str | None:
    """None when the data set can be read, else the reason (a test's skip message)."""
    if name == "synthetic":
        return None
    path = DATA_DIR / name / "test.jsonl"
    if not path.is_file():
        return f"data set {name!r} not found at {path} (the tests read ../shared/data next to the repository)"
    return None


@lru_cache(maxsize=None)
def load_rows(name: str) -> tuple[dict, ...]:
    """The records of ``name``'s test split (``synthetic``: one record per synthetic gold)."""
    if name == "synthetic":
        return tuple({"question": f"Synthetic problem {i}.", "gold": g} for i, g in enumerate(SYNTHETIC))
    with (DATA_DIR / name / "test.jsonl").open() as f:
        return tuple(json.loads(line) for line in f if line.strip())


def _last_boxed(text: str) -> str | None:
    try:  # the brief's extractor for Minerva's golds
        from core.rewards.math_answer import last_boxed
    except (ImportError, AttributeError):  # pragma: no cover - only while core is being rewritten
        i = text.rfind("\\boxed{")
        if i < 0:
            return None
        depth = 0
        for k in range(i + 6, len(text)):
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            if depth == 0:
                return text[i + 7:k]
        return None
    return last_boxed(text)


def _number_field(x) -> str:
    """The pipeline's conversion of a numeric ``answer`` field (core.data.prepare): 27.0 -> '27', '025' -> '25'."""
    f = float(x)
    return str(int(f)) if f.is_integer() else str(f)


def gold_of(name: str, row: dict) -> str:
    """The ground truth a scorer receives for ``row`` of data set ``name``."""
    if name == "gsm8k":
        return row["answer"].split("####")[-1].strip().replace(",", "")
    if name == "minerva_math":
        return _last_boxed(row["solution"])
    if name in ("aime24", "amc23"):
        return _number_field(row["answer"])
    if name == "synthetic":
        return row["gold"]
    raise KeyError(name)


def question_of(row: dict) -> str:
    return row.get("question") or row.get("problem") or ""


@lru_cache(maxsize=None)
def load_golds(name: str) -> tuple[str, ...]:
    return tuple(gold_of(name, r) for r in load_rows(name))


def subsample(n_total: int, n: int | None, seed: int = SEED, must: tuple[int, ...] = ()) -> list[int]:
    """``n`` indices of ``range(n_total)`` (all when n is None or >= n_total), sorted, always including ``must``."""
    if n is None or n >= n_total:
        return list(range(n_total))
    rest = [i for i in range(n_total) if i not in set(must)]
    picked = set(must) | set(random.Random(seed).sample(rest, max(0, min(len(rest), n - len(must)))))
    return sorted(picked)


# ------------------------------------------------------------------------------------------- synthetic MATH golds

def _synthetic() -> tuple[str, ...]:
    rng = random.Random(SEED)
    golds: list[str] = []
    while len(golds) < 8:  # proper fractions and improper ones, some negative
        q = rng.randint(2, 12)
        p = rng.randint(1, 3 * q)
        if Fraction(p, q).denominator == 1 or Fraction(p, q).denominator != q:
            continue
        g = f"{'-' if rng.random() < 0.3 else ''}\\frac{{{p}}}{{{q}}}"
        if g not in golds:
            golds.append(g)
    golds += [str(rng.randint(10, 999)) for _ in range(3)]
    golds += ["3000000", "1000000", "0.5", "2.75", "3.14", "0.10", "3e6", "8.49e-4", "6.02 \\times 10^{23}"]
    golds += list(HANDCRAFTED)
    return tuple(golds)


# gold -> (equivalent bodies, non-equivalent bodies), for golds a value cannot describe
HANDCRAFTED: dict[str, tuple[list[str], list[str]]] = {
    "\\sqrt{2}": (["\\sqrt2", "2^{1/2}", "\\sqrt{ 2 }"], ["2", "\\sqrt{3}", "1.414", "1.41421356"]),
    "2\\sqrt{3}": (["\\sqrt{12}", "2 \\sqrt{3}", "2\\cdot\\sqrt{3}"], ["3\\sqrt{2}", "\\sqrt{6}", "3.4641016"]),
    "\\frac{\\sqrt{3}}{2}": (["\\dfrac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}", "\\sqrt{3}/2"],
                             ["\\frac{\\sqrt{2}}{2}", "0.8660254", "\\frac{3}{2}"]),
    "\\pi": (["\\pi"], ["3.14", "3.14159265", "\\pi/2", "2\\pi"]),
    "3\\pi": (["3 \\pi", "\\pi \\cdot 3"], ["9.42477796", "\\pi"]),
    "(1, 2)": (["(1,2)", "\\left(1, 2\\right)"], ["(2, 1)", "(1, 3)", "[1, 2]"]),
    "[0, 1)": (["[0,1)", "\\left[0, 1\\right)"], ["[0, 1]", "(0, 1)", "[0, 2)"]),
    "x^2+1": (["x^{2}+1", "1+x^2", "x^2 + 1"], ["x^2-1", "x^2", "x^3+1"]),
    "1011_2": (["1011_{2}"], ["10112", "1011_3", "1101_2"]),
    "\\text{(B)}": (["\\text{B}", "(B)"], ["\\text{(C)}", "C"]),
    "\\infty": (["+\\infty"], ["-\\infty", "0"]),
    "5, 7": (["5,7", "5,\\ 7"], ["5", "7", "5, 8"]),
    "90^\\circ": (["90", "90^{\\circ}", "90 \\text{ degrees}"], ["89^\\circ", "180^\\circ"]),
}

SYNTHETIC = _synthetic()


# ------------------------------------------------------------------------------------------------- number reading

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


def gold_category(gold: str) -> str:
    if gold in HANDCRAFTED:
        return "handcrafted"
    n = read_number(gold)
    if n is None:
        return "symbolic"
    if n.places is not None:
        return "sci_decimal" if n.exp or "\\times" in gold or "e" in gold.lower() else "decimal"
    if n.value.denominator != 1:
        return "fraction"
    if _SCI.fullmatch(gold.strip()):
        return "sci_exact"
    return "integer"


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


# ----------------------------------------------------------------------------------------------------- the forms

@dataclass(frozen=True)
class Form:
    kind: str                      # "eq.<form>", "neq.<form>" or "hedge.<form>"
    body: str | tuple[str, str]    # the answer text; a pair: two answer markers (two boxes, two '####', ...)
    label: bool                    # the answer is right


def _numeric_forms(gold: str, n: Num) -> list[tuple[str, str, Fraction | None]]:
    """(kind, body, value) for a numeric gold; the value labels the form through ``is_right``."""
    v = n.value
    out: list[tuple[str, str, Fraction | None]] = []
    add = lambda kind, body, value: out.append((kind, body, value))  # noqa: E731
    c = canonical(v)
    add("eq.plain", c, v)
    if n.places is None:  # ---------------------------------------------------------------- exact golds
        if v.denominator == 1:
            i = v.numerator
            add("eq.point0", f"{i}.0", v)
            add("eq.point00", f"{i}.00", v)
            add("eq.trailing_point", f"{i}.", v)
            if i >= 0:
                add("eq.dollar", f"\\${i}", v)
            add("eq.text_dollars", f"{i} \\text{{ dollars}}", v)
            add("eq.frac_double", f"\\frac{{{2 * i}}}{{2}}", v)
            add("eq.dfrac_double", f"\\dfrac{{{2 * i}}}{{2}}", v)
            add("eq.x_equals", f"x = {i}", v)
            if i > 0:
                add("eq.plus_sign", f"+{i}", v)
            if abs(i) >= 1000:
                add("eq.thousands_comma", f"{i:,}", v)
                add("eq.thousands_brace", f"{i:,}".replace(",", "{,}"), v)
            if 0 < i < 100:
                add("eq.leading_zero", f"{i:03d}", v)
            if i != 0:
                m, e = sci(v)
                add("eq.sci_times", f"{m} \\times 10^{{{e}}}", v)
                add("eq.sci_e", f"{m}e{e}", v)
                add("neq.rel_1e-7", dec(v * (1 + Fraction(1, 10 ** 7))), v * (1 + Fraction(1, 10 ** 7)))
                add("neq.times10", str(10 * i), 10 * v)
                add("neq.half", latex_frac(v / 2), v / 2)
                add("neq.neg", str(-i), -v)
                add("neq.zero", "0", Fraction(0))
            add("neq.plus1", str(i + 1), v + 1)
            add("neq.minus1", str(i - 1), v - 1)
        else:
            p, q = abs(v.numerator), v.denominator
            sign = "-" if v < 0 else ""
            add("eq.frac", f"{sign}\\frac{{{p}}}{{{q}}}", v)
            add("eq.dfrac", f"{sign}\\dfrac{{{p}}}{{{q}}}", v)
            add("eq.tfrac", f"{sign}\\tfrac{{{p}}}{{{q}}}", v)
            add("eq.slash", f"{sign}{p}/{q}", v)
            if sign:
                add("eq.frac_neg_numerator", f"\\frac{{-{p}}}{{{q}}}", v)
            if p < 10 and q < 10:
                add("eq.frac_nobraces", f"{sign}\\frac{p}{q}", v)
            add("eq.frac_double", f"{sign}\\frac{{{2 * p}}}{{{2 * q}}}", v)
            add("eq.x_equals", f"x = {sign}\\frac{{{p}}}{{{q}}}", v)
            if dec(v) is not None:
                add("eq.decimal", dec(v), v)
            else:
                d7 = Fraction(Decimal(f"{float(v):.7g}"))
                add("neq.rounded_7sig", f"{float(v):.7g}", d7)
                d2 = Fraction(Decimal(f"{float(v):.2f}"))
                add("neq.rounded_2dp", f"{float(v):.2f}", d2)
            add("neq.other_frac", f"{sign}\\frac{{{p}}}{{{q + 1}}}", v * q / (q + 1))
            add("neq.reciprocal", latex_frac(1 / v), 1 / v)
            add("neq.plus1", latex_frac(v + 1), v + 1)
            add("neq.times10", latex_frac(10 * v), 10 * v)
            add("neq.neg", latex_frac(-v), -v)
            add("neq.zero", "0", Fraction(0))
            rel = v * (1 + Fraction(1, 10 ** 7))
            add("neq.rel_1e-7", f"{float(rel):.12g}", Fraction(Decimal(f"{float(rel):.12g}")))
        if _SCI.fullmatch(gold.strip()):  # exact scientific golds (3e6): their own spellings
            m, e = n.mantissa, n.exp
            add("eq.sci_times", f"{m} \\times 10^{{{e}}}", v)
            add("eq.sci_e", f"{m}e{e}", v)
            add("eq.sci_point0", f"{m}.0e{e}", v)
            if v.denominator == 1:
                add("neq.plus1_big", str(v.numerator + 1), v + 1)
            up = Fraction(Decimal(m)) + Fraction(1, 10)
            add("neq.mantissa_up", f"{Decimal(m) + Decimal('0.1')}e{e}", up * Fraction(10) ** e)
            add("neq.exp_up", f"{m}e{e + 1}", v * 10)
            add("neq.exp_down", f"{m}e{e - 1}", v / 10)
    else:  # -------------------------------------------------------------------------------- decimal golds
        ulp = Fraction(10) ** (-n.places)
        sign = -1 if v < 0 else 1
        mant, exp = n.mantissa, n.exp
        def with_mant(mm: str) -> str:
            return mm if not exp and "\\times" not in gold and "e" not in gold.lower() else f"{mm}e{exp}"
        add("eq.same", gold.strip(), v)
        add("eq.extra_digit", with_mant(mant + "3"), v + sign * ulp * Fraction(3, 10))
        add("eq.extra_digits_49", with_mant(mant + "49"), v + sign * ulp * Fraction(49, 100))
        if mant.endswith("0") and "." in mant:
            mm = mant.rstrip("0").rstrip(".")
            add("eq.strip_trailing_zero", with_mant(mm), v)
        s = sci(v)
        if s and v != 0:
            m, e = s
            add("eq.sci_times", f"{m} \\times 10^{{{e}}}", v)
            add("eq.sci_cdot", f"{m} \\cdot 10^{{{e}}}", v)
            add("eq.sci_e", f"{m}e{e}", v)
            add("eq.sci_E", f"{m}E{e:+d}", v)
            if abs(e) <= 40:
                add("eq.plain_decimal", dec(v), v)
        if v.denominator <= 1000 and v.denominator != 1:
            add("eq.frac", latex_frac(v), v)
        add("eq.text_unit", f"{gold.strip()} \\text{{ cm}}", v)
        add("eq.x_equals", f"x = {gold.strip()}", v)
        up, down = v + ulp, v - ulp
        add("neq.ulp_up", _write_like(up, n, gold), up)
        add("neq.ulp_down", _write_like(down, n, gold), down)
        if n.places >= 1:
            coarse = Fraction(Decimal(fixed(v, n.places - 1)))
            add("neq.one_digit_less", _write_like(coarse, Num(v, n.places - 1, "", exp), gold), coarse)
        add("neq.times10", _write_like(10 * v, Num(10 * v, n.places - 1, "", exp), gold), 10 * v)
        add("neq.plus1", canonical(v + 1), v + 1)
        if v != 0:
            add("neq.neg", "-" + gold.strip().lstrip("+-") if v > 0 else gold.strip().lstrip("-"), -v)
            add("neq.zero", "0", Fraction(0))
        if exp:
            add("neq.mantissa_only", mant, Fraction(Decimal(mant)))
            add("neq.exp_sign_flip", f"{mant}e{-exp}", Fraction(Decimal(mant)) * Fraction(10) ** (-exp))
    return out


def _write_like(x: Fraction, n: Num, gold: str) -> str:
    """``x`` written the way the decimal gold ``gold`` is (plain, or mantissa-e-exponent), at ``n.places``."""
    if n.exp or "e" in gold.lower() or "\\times" in gold:
        exp = n.exp
        mant = x / Fraction(10) ** exp
        places = max(0, n.places + exp)
        return f"{fixed(mant, places)}e{exp}"
    return fixed(x, max(0, n.places))


NO_ARITHMETIC = {"\\infty": "-\\infty"}  # golds that "+1" or "2x" leave unchanged -> their wrong alternative


def _alt(gold: str) -> str:
    """A plausible wrong value to hedge with: gold + 1 (a decimal gold: + 10 units in its last place)."""
    n = read_number(gold)
    if gold.strip() in NO_ARITHMETIC:
        return NO_ARITHMETIC[gold.strip()]
    if n is None:
        return f"{gold.strip()}+1"
    if n.places is None:
        return canonical(n.value + 1)
    return _write_like(n.value + 10 * Fraction(10) ** (-n.places), n, gold)


def _as_written(gold: str) -> str:
    n = read_number(gold)
    return gold.strip() if n is None or n.places is not None else canonical(n.value)


def _hedges(gold: str) -> list[Form]:
    a, b = _as_written(gold), _alt(gold)
    out = []
    for order, (x, y) in (("gold_first", (a, b)), ("gold_last", (b, a))):
        out += [Form(f"hedge.or_text.{order}", f"{x} \\text{{ or }} {y}", False),
                Form(f"hedge.or_plain.{order}", f"{x} or {y}", False),
                Form(f"hedge.comma_list.{order}", f"{x}, {y}", False),
                Form(f"hedge.two_markers.{order}", (x, y), False)]
    lo, hi = (a, b)
    out += [Form("hedge.interval_closed", f"[{lo}, {hi}]", False),
            Form("hedge.interval_open", f"({lo}, {hi})", False),
            Form("hedge.set", f"\\{{{lo}, {hi}\\}}", False),
            Form("hedge.pm", f"{a} \\pm 1", False)]
    return out


@lru_cache(maxsize=None)
def forms(gold: str) -> tuple[Form, ...]:
    """Every generated answer body for ``gold``, labelled."""
    gold_s = gold.strip()
    out: list[Form] = []
    n = read_number(gold_s)
    if n is not None:
        for kind, body, value in _numeric_forms(gold_s, n):
            if body is None or body == "":
                continue
            label = is_right(n, value)
            if label != kind.startswith("eq."):
                continue  # a form whose intent the value contradicts (gold 0: 10*0 == 0): dropped
            out.append(Form(kind, body, label))
    else:
        out.append(Form("eq.same", gold_s, True))
        if " " in gold_s:
            out.append(Form("eq.nospace", re.sub(r"\s+", "", gold_s), True))
        if "\\frac" in gold_s and "\\dfrac" not in gold_s:
            out.append(Form("eq.dfrac", gold_s.replace("\\frac", "\\dfrac"), True))
        if "\\left" in gold_s:
            out.append(Form("eq.no_left_right", gold_s.replace("\\left", "").replace("\\right", ""), True))
        out.append(Form("eq.displaystyle", f"\\displaystyle {gold_s}", True))
        if gold_s not in NO_ARITHMETIC:
            out.append(Form("neq.append_plus1", f"{gold_s}+1", False))
        if "=" not in gold_s and "," not in gold_s and gold_s not in NO_ARITHMETIC:
            out.append(Form("neq.neg", f"-\\left({gold_s}\\right)", False))
            out.append(Form("neq.times2", f"2\\left({gold_s}\\right)", False))
        if gold_s != "0":
            out.append(Form("neq.zero", "0", False))
        if gold_s in HANDCRAFTED:
            eqs, neqs = HANDCRAFTED[gold_s]
            out += [Form(f"eq.hand{i}", b, True) for i, b in enumerate(eqs)]
            out += [Form(f"neq.hand{i}", b, False) for i, b in enumerate(neqs)]
    out += _hedges(gold_s)
    seen, uniq = set(), []
    for f in out:  # one form per (body, label): the first kind names it
        key = (f.body, f.label)
        if key not in seen:
            seen.add(key)
            uniq.append(f)
    return tuple(uniq)


# --------------------------------------------------------------------------------------------------- the formats

PREFIXES = (
    "Let me work through this step by step. First, 2 + 3 = 5, and 5 * 4 = 20.",
    "We set up the equation and simplify both sides carefully.",
    "Checking the cases one at a time gives a single consistent value.",
)
LONG_TAIL = (("To double-check, we can reread the problem statement and confirm that each step above only used "
              "the given conditions, that no case was skipped, and that the simplification preserved equality. ")
             * 20)[:2000]
assert len(LONG_TAIL) == 2000 and not re.search(r"\d|####|boxed|answer\s*:", LONG_TAIL, re.I)

# format -> (one answer marker, two answer markers)
FORMATS = {
    "gsm8k": ("{p}\n#### {a}", "{p}\n#### {a}\n#### {b}"),
    "plain": ("{p}\nSo the result is {a}", "{p}\nSo the result is {a} or {b}"),
    "boxed": ("{p}\nTherefore, the final answer is $\\boxed{{{a}}}$.",
              "{p}\nSo it is $\\boxed{{{a}}}$ or $\\boxed{{{b}}}$."),
    "dapo": ("{p}\nAnswer: {a}", "{p}\nAnswer: {a}\nAnswer: {b}"),
    "dapo_boxed": ("{p}\nAnswer: \\boxed{{{a}}}", "{p}\nAnswer: \\boxed{{{a}}}\nAnswer: \\boxed{{{b}}}"),
    "geo3k": ("<think>{p}</think> The answer is \\boxed{{{a}}}.",
              "<think>{p}</think> It is \\boxed{{{a}}} or \\boxed{{{b}}}."),
    "retool": ("{p}\n<tool_call>{{\"name\": \"code_interpreter\", \"arguments\": {{\"code\": \"print(2 + 3)\"}}}}"
               "</tool_call>\nThe tool confirms it, so the final answer is \\boxed{{{a}}}.",
               "{p}\n<tool_call>{{\"name\": \"code_interpreter\", \"arguments\": {{\"code\": \"print(2 + 3)\"}}}}"
               "</tool_call>\nIt is \\boxed{{{a}}} or \\boxed{{{b}}}."),
}


def wrap(fmt: str, body: str | tuple[str, str], prefix: str = PREFIXES[0]) -> str:
    """The full response: ``body`` in format ``fmt`` after some reasoning text."""
    one, two = FORMATS[fmt]
    if isinstance(body, tuple):
        return two.format(p=prefix, a=body[0], b=body[1])
    return one.format(p=prefix, a=body)


@dataclass(frozen=True)
class Pair:
    dataset: str
    gold: str
    gold_cat: str
    kind: str
    label: bool
    fmt: str
    response: str
    body: str = ""  # the answer inside the format ("a | b" for two markers), for reports

    @property
    def cls(self) -> str:
        """The disagreement class a pair falls in: gold category and form."""
        return f"{self.gold_cat}:{self.kind}"


def pairs(dataset: str, fmt: str, n_golds: int | None = None, seed: int = SEED, long_tail: bool = True) -> list[Pair]:
    """Every form of (a deterministic subsample of ``n_golds`` distinct golds of) ``dataset``, wrapped in ``fmt``.
    Also, per gold: its plain right answer followed by 2,000 characters of explanation (``eq.plain+tail2000``), and
    "the answer is <gold> or <gold+1>" as prose with no answer marker (``hedge.prose``)."""
    golds = list(dict.fromkeys(g for g in load_golds(dataset) if g is not None))
    golds = [golds[i] for i in subsample(len(golds), n_golds, seed)]
    rng = random.Random(f"{seed}:{dataset}:{fmt}")
    out = []
    for gold in golds:
        cat = gold_category(gold)
        fs = forms(gold)
        for f in fs:
            body = " | ".join(f.body) if isinstance(f.body, tuple) else f.body
            out.append(Pair(dataset, gold, cat, f.kind, f.label, fmt, wrap(fmt, f.body, rng.choice(PREFIXES)), body))
        plain = next(f for f in fs if f.label)
        if long_tail:
            response = wrap(fmt, plain.body, rng.choice(PREFIXES)) + "\n\n" + LONG_TAIL
            out.append(Pair(dataset, gold, cat, "eq.plain+tail2000", True, fmt, response, plain.body + " +2000 chars"))
        prose = f"The answer is {_as_written(gold)} or {_alt(gold)}."
        out.append(Pair(dataset, gold, cat, "hedge.prose", False, fmt, f"{rng.choice(PREFIXES)}\n{prose}", prose))
    return out
