"""core.rewards.equations: the rejection filter on equations and on pairs of an equation and an expression.

Grounding as in test_latex_eval: each EQUAL pair math-verify calls equal and each WRONG pair unequal (checked
below); differ is never True on a pair math-verify calls equal, except the listed DEVIATIONS, where math-verify's
reading is not the mathematics (a derivative read as 0, ``y'`` read as ``y``) and the scorer rejects.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from core.rewards.equations import differ
from core.rewards.math_answer import is_equiv
from tests.rewards.test_latex_eval import PIECES, mv_equal

EQUAL = [  # math-verify: equal
    ("y = 2x + 3", "y - 2x = 3"), ("2y = 4x + 6", "y = 2x + 3"), ("x = 5", "5"), ("y = 2x + 3", "2x + 3"),
    ("SRAC = LRAC", "LRAC = SRAC"), ("X_{d}=125-1.25 P", r"X_d = 125 - \frac{5}{4} P"), ("x^2 = 1", "x^2 - 1 = 0"),
    ("a = b", "b = a"), (r"\sin^2 \theta + y = 1", r"y = \cos^2 \theta"),
    (r"x^{\prime}+\frac{r}{V} x-r c=0", r"x^{\prime} = r c - \frac{r x}{V}"),
]
WRONG = [  # math-verify: unequal; differ must find it (a real root of one that is not a root of the other)
    ("y = 2x + 3", "y = 2x + 4"), ("SRAC=LRAC", "SRAC=LRAC + 1"), ("x = 5", "6"),
    ("X_{d}=125-1.25 P", "X_d = 125 - 1.5 P"), (r"y = \sin x", r"y = \cos x"),
    (r"\frac{dx}{dt}=kx-a", r"\frac{dx}{dt} = kx + a"), (r"\dot{x} + x", r"\dot{x} + 2x"),
    # complex-valued (I is the imaginary unit there): a real root of real and imaginary parts together
    (r"I \frac{d \omega}{d t}+2 B \omega=T", r"I \frac{d \omega}{d t}+2 B \omega=T + 1"), ("x + I y = 0", "x + I y = 1"),
    (r"m l \ddot{\theta}(t)-m g \sin \theta(t)=f(t) \cos \theta(t)",
     r"m l \ddot{\theta}(t)-m g \sin \theta(t)=f(t) \cos \theta(t) + 1"), ("m f(t) = 1", "m f(t) = 2"),
]
DEVIATIONS = [  # math-verify: equal; not the mathematics: rejected here
    (r"\frac{dx}{dt}=kx-a", "kx-a=0"), ("y'+r y=0", "y+r y=0"), (r"\frac{d x}{d t}", "0"),
]
UNDECIDED = [  # no claim either way: math-verify decides (some equal there: empty real solution sets, chains)
    ("x^2 = -1", "x^2 = -2"), ("x^2 = 1", "x = 1"), ("a = b = c", "a = c"), ("0 = 0", "1 = 1"), ("x = x", "y = y"),
    ("x(x^2+1) = 0", "x = 0"), (r"\sin x = 0", r"\tan x = 0"), (r"m \frac{d v}{d t}+b v=f", r"m \frac{dv}{dt} = f - b v"),
    # equal there: function values leave no symbol to solve for; floats in solutions are rounded to 6 places; I^2 is I
    ("f(1) = 2", "f(1) = 3"), ("I(0) = 5", "I(0) = 6"), (r"y(\pi) = 0", r"y(\pi) = 1"),
    ("10000000 x y = 1.0 y", "10000000 x y = 2.0 y"), ("3000000 x y = y", "3000000 x y = 1.1 y"),
    ("P = I^2 R", "P = I R"), ("i = 3", "i = 4"), ("x I = 2", "i = 3"),
    # a call is one value (f(0) read as f*0 = 0 would make c = 0 a root of the first only): equal
    ("y c = f(0)", r"y = \frac{f(0)}{c}"), (r"y = \frac{y(0)}{x_0}", "y x_0 = y(0)"),
]


def test_lists_are_grounded_in_math_verify():
    pytest.importorskip("math_verify")
    assert [p for p in EQUAL + DEVIATIONS if not mv_equal(*p)] == []
    assert [p for p in WRONG if mv_equal(*p)] == []


@pytest.mark.parametrize("a,b", EQUAL + UNDECIDED)
def test_equal_or_undecided_never_differ(a, b):
    assert not differ(a, b) and not differ(b, a)


@pytest.mark.parametrize("a,b", WRONG + DEVIATIONS)
def test_wrong_and_deviations_differ(a, b):
    assert differ(a, b) and differ(b, a)


@pytest.mark.parametrize("gold,answer", DEVIATIONS)
def test_deviations_score_wrong(gold, answer):
    assert not is_equiv(answer, gold)


def test_a_gold_in_two_math_regions_is_read_whole():
    """``A+$ $B`` (a Minerva gold): math-verify reads only ``B``, so the whole right answer scored 0."""
    gold = r"x_{0} \cos (\omega t)+$ $\dot{x}_{0} \sin (\omega t) / \omega"
    assert is_equiv(r"x_0 \cos(\omega t) + \frac{\dot{x}_0}{\omega} \sin(\omega t)", gold)
    assert not is_equiv(r"\dot{x}_{0} \sin (\omega t) / \omega", gold)


def test_a_gold_read_as_undefined_is_compared_as_text():
    """math-verify reads ``\\gamma^{2}`` as zoo**2: any answer with the same undefined parts would compare equal."""
    pytest.importorskip("math_verify")
    gold = r"m_{p} c^{2}\left(\gamma^{2}-1\right) \sin ^{2} \theta"
    assert is_equiv(r"m_{p} c^{2}(\gamma^{2}-1) \sin^{2}\theta", gold)
    assert not is_equiv(r"m_{p} c^{2}\left(\gamma^{2}+1\right) \sin ^{2} \theta", gold)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(PIECES + ["=", " = ", "I", r"\dot{x}", "y'", r"\frac{dx}{dt}"]), max_size=30)
       .map("".join))
def test_never_raises_and_never_differs_from_itself(s):
    assert differ(s, s) is False
    assert differ(s, "x = 1") in (True, False) and differ("y", s) in (True, False)
