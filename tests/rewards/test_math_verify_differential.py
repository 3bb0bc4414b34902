"""Our MATH scorers against Math-Verify, on generated answers with known labels (tests/rewards/answers.py).

For each data set (its golds, in the MATH ``\\boxed{}`` format, scored through the data set's own data source in
``core.rewards.REWARDS``), every pair is classified against its label: agree (both right), ours-better (we are
right, Math-Verify wrong), theirs-better (Math-Verify right, we are wrong), both-wrong. theirs-better and
both-wrong must be empty except for the classes listed in KNOWN. ``pytest -s`` prints the counts and each class
with examples.

Math-Verify's verdict: ``verify(parse(gold), parse(response))`` on the whole response (answers.math_verify_accepts).
Note: our scorer itself may consult math-verify when it is installed, so this compares our pipeline around it.
"""

from __future__ import annotations

import time
from collections import Counter
from fractions import Fraction

import pytest

from tests.rewards import answers as A, exact as E, golds as G, references as R

# the default sizes run with `make test-heavy` (in CI), ~25 s; `slow` below: every gold
pytestmark = pytest.mark.heavy

# data set -> (data source our scorer is called with, golds in the default run); the slow run takes every gold
SOURCES = {"gsm8k": "math", "minerva_math": "minerva_math", "aime24": "aime24", "amc23": "amc23",
           "synthetic": "lighteval/MATH"}
N_GOLDS = {"gsm8k": 10, "minerva_math": 24, "aime24": 8, "amc23": 8, "synthetic": None}

# class name -> (predicate on a Pair, or a Pair.cls string; reason). Empty until reviewed: what the test finds is
# reported, and a class is listed here only once it is judged not a bug of ours.
KNOWN: dict[str, tuple] = {}


def records(dataset: str, n_golds: int | None) -> list[R.Record]:
    source = SOURCES[dataset]
    out = []
    for p in A.pairs(dataset, "boxed", n_golds):
        ours = R.accepted(R.ours(source, p.response, p.gold))
        out.append(R.Record(p, ours, R.math_verify_accepts(p.gold, p.response)))
    return out


def report(dataset: str, recs: list[R.Record], seconds: float) -> str:
    c = Counter(r.outcome for r in recs)
    lines = [f"\n== {dataset} (source {SOURCES[dataset]!r}, {len(recs)} pairs, {seconds:.1f} s): ours vs Math-Verify",
             R.markdown(["data set", "pairs", *R.OUTCOMES], [[dataset, len(recs), *(c[o] for o in R.OUTCOMES)]])]
    for outcome in ("theirs-better", "both-wrong", "ours-better"):
        groups = R.by_class(recs, lambda r, o=outcome: r.outcome == o)
        if groups:
            lines.append(f"-- {outcome}: {sum(map(len, groups.values()))} pairs in {len(groups)} classes")
            lines += R.class_lines(groups, "ours", "mv", k=1 if outcome == "ours-better" else 3)
    return "\n".join(lines)


def check(dataset: str, n_golds: int | None):
    for why in (R.missing_module("math_verify"), G.data_missing(dataset)):
        if why:
            pytest.skip(why)
    t = time.perf_counter()
    recs = records(dataset, n_golds)
    print(report(dataset, recs, time.perf_counter() - t))
    bad = [r for r in recs if r.outcome in ("theirs-better", "both-wrong") and not R.known_class(KNOWN, r.pair)]
    groups = R.by_class(bad)
    assert not bad, (f"{dataset}: {len(bad)} pairs where our scorer is wrong (theirs-better or both-wrong), "
                     f"in {len(groups)} classes not in KNOWN:\n" + "\n".join(R.class_lines(groups, "ours", "mv", k=2)))


@pytest.mark.parametrize("dataset", G.ALL_SETS)
def test_ours_vs_math_verify(dataset):
    check(dataset, N_GOLDS[dataset])


@pytest.mark.slow  # every gold: ~22,000 pairs, several minutes (not `heavy`: CI runs heavy, kept to ~4 min in all)
@pytest.mark.parametrize("dataset", G.ALL_SETS)
def test_ours_vs_math_verify_every_gold(dataset):
    check(dataset, None)


def test_generated_labels_follow_the_rule():
    """The generator's labels on the brief's examples (no scorer involved)."""
    n = E.read_number
    assert E.is_right(n("3.14"), Fraction("3.14159")) and not E.is_right(n("3.14"), Fraction("3.15"))
    assert E.is_right(n("7.4e-12"), Fraction("7.41e-12"))
    assert not E.is_right(n("7.4e-12"), Fraction(0)) and not E.is_right(n("7.4e-12"), Fraction("8e-12"))
    assert not E.is_right(n("\\frac{1}{3}"), Fraction("0.3333333"))
    assert E.is_right(n("\\frac{1}{2}"), Fraction("0.5"))
    assert not E.is_right(n("3e6"), Fraction(3000001)) and E.is_right(n("8.49e-4"), Fraction("0.000849"))
    assert E.is_right(n("-1./3"), Fraction(-1, 3)) and not E.is_right(n("-1./3"), Fraction(2, 3))
    kinds = {f.kind: f for f in A.forms("72")}
    assert kinds["eq.sci_times"].body == "7.2 \\times 10^{1}" and kinds["eq.sci_times"].label
    assert not kinds["neq.rel_1e-7"].label and not kinds["hedge.two_markers.gold_last"].label
    assert A.pairs("synthetic", "boxed") == A.pairs("synthetic", "boxed")  # deterministic


def test_random_numeric_golds_are_scored_by_their_labels():
    """Random integer, fraction, decimal and scientific golds (drawn by hypothesis, derandomized; 40 of them, no
    shrinking: every failing form of every gold is reported): our MATH scorer gives every generated \\boxed{} answer
    its label, except the KNOWN classes. Labels only, no Math-Verify verdicts."""
    pytest.importorskip("hypothesis", reason="hypothesis is not installed")
    from decimal import Decimal

    from hypothesis import HealthCheck, Phase, given, settings, strategies as st

    strategy = st.one_of(
        st.integers(-10 ** 7, 10 ** 7).map(str),
        st.tuples(st.integers(-60, 60), st.integers(2, 40)).filter(lambda t: t[0] % t[1] != 0)
          .map(lambda t: E.latex_frac(Fraction(*t))),
        st.tuples(st.integers(-99999, 99999), st.integers(1, 4))
          .map(lambda t: format(Decimal(t[0]).scaleb(-t[1]), "f")),
        st.tuples(st.integers(100, 999), st.integers(-15, 15)).map(lambda t: f"{t[0] // 100}.{t[0] % 100:02d}e{t[1]}"),
    )
    golds: list[str] = []

    @settings(max_examples=40, derandomize=True, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def draw(gold):
        golds.append(gold)

    draw()
    recs = []
    for gold in dict.fromkeys(golds):
        for f in A.forms(gold):
            response = A.wrap("boxed", f.body)
            body = " | ".join(f.body) if isinstance(f.body, tuple) else f.body
            pair = A.Pair("hypothesis", gold, A.gold_category(gold), f.kind, f.label, "boxed", response, body)
            ok = R.accepted(R.ours("lighteval/MATH", response, gold))
            recs.append(R.Record(pair, ok, f.label))  # "theirs" = the label itself
    bad = [r for r in recs if r.ours != r.pair.label and not R.known_class(KNOWN, r.pair)]
    groups = R.by_class(bad)
    assert not bad, (f"{len(bad)} of {len(recs)} answers to {len(set(golds))} random golds scored against their "
                     f"label, in {len(groups)} classes:\n" + "\n".join(R.class_lines(groups, "ours", "label", k=2)))
