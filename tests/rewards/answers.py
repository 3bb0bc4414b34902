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
import random
import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache

from tests.rewards.exact import _SCI, Num, canonical, dec, fixed, is_right, latex_frac, read_number, sci
from tests.rewards.golds import HANDCRAFTED, SEED, load_golds, subsample


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
