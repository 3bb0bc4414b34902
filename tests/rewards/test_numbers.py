"""Property tests of the answer-number parser (core/rewards/numbers.py): exact round trips of integers, decimals,
fractions and scientific notation; the rule symmetric between numbers written to one precision; no exception on
any string, through the parser and every registered scorer."""

from fractions import Fraction

from hypothesis import given, settings, strategies as st

from core.rewards import REWARDS, default_compute_score
from core.rewards.math_answer import is_equiv, normalize
from core.rewards.numbers import MAX_DIGITS, Number, matches, parse_number

INTS = st.integers(min_value=-10**30, max_value=10**30)


@given(INTS)
def test_integers_round_trip_exactly(n):
    assert parse_number(str(n)) == Number(Fraction(n))
    if abs(n) >= 1000:
        assert parse_number(f"{n:,}") == Number(Fraction(n))  # thousands separators


@given(INTS, st.integers(min_value=1, max_value=12))
def test_decimals_round_trip_to_their_written_precision(m, k):
    text = f"{'-' if m < 0 else ''}{abs(m) // 10**k}.{abs(m) % 10**k:0{k}d}"
    got = parse_number(text)
    assert got.value == Fraction(m, 10**k)
    assert got.unit == (None if m % 10**k == 0 else Fraction(1, 10**k))  # 72.00 is the integer 72


@given(INTS, st.integers(min_value=1, max_value=10**12))
def test_fractions_round_trip_exactly(a, b):
    for text in (f"\\frac{{{a}}}{{{b}}}", f"{a}/{b}"):
        assert parse_number(text) == Number(Fraction(a, b))


@given(st.integers(min_value=-10**6, max_value=10**6), st.integers(min_value=-300, max_value=300))
def test_scientific_notation_round_trips(m, e):
    for text in (f"{m}e{e}", f"{m}\\times10^{{{e}}}", f"{m}\\cdot10^{{{e}}}"):  # an integer mantissa: exact
        assert parse_number(text) == Number(m * Fraction(10) ** e)
    for text in (f"{m}.5e{e}", f"{m}.5\\times10^{{{e}}}"):  # a decimal point: to its last digit
        got = parse_number(text)
        assert got.unit == Fraction(10) ** (e - 1) and got.value == (m + Fraction(1, 2) * (-1 if m < 0 else 1)) * Fraction(10) ** e


@given(INTS, INTS, st.integers(min_value=0, max_value=8))
def test_equality_is_symmetric_between_numbers_of_one_precision(a, b, k):
    x, y = (parse_number(f"{n}/{10**k}") for n in (a, b))
    assert matches(x, y) == matches(y, x) == (a == b)
    if k:
        xs, ys = (parse_number(f"{'-' if n < 0 else ''}{abs(n) // 10**k}.{abs(n) % 10**k:0{k}d}") for n in (a, b))
        assert matches(xs, ys) == matches(ys, xs)


@given(st.text(max_size=300))
@settings(max_examples=300, deadline=None)
def test_no_string_raises(text):
    parse_number(text)
    normalize(text)
    is_equiv(text, "42", use_math_verify=False)
    for source in REWARDS.names():
        default_compute_score(source, text, "42")
        default_compute_score(source, f"\\boxed{{{text}}} #### {text}\nAnswer: {text}", "42")


@given(st.text(alphabet="0123456789.,-+e_/{}\\frac^ ", max_size=2 * MAX_DIGITS + 80))
@settings(max_examples=500, deadline=None)
def test_number_like_strings_never_raise_and_stay_bounded(text):
    got = parse_number(text)
    assert got is None or (abs(got.value.numerator).bit_length() < 10_000 and got.value.denominator.bit_length() < 10_000)
