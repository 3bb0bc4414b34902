"""Reward-hacking probe: constant, empty, echoed, huge and hedged answers against every scorer.

Every scorer -- each function registered in ``core.rewards.REWARDS`` and each recipe's reward file for the data
sources it handles -- is applied to every data set in ``../shared/data`` (gsm8k, minerva_math, aime24, amc23), each
answer wrapped in the format that scorer wants (``#### n``, ``\\boxed{}``, ``Answer: ``, ``<think>..</think>
\\boxed{}``, or a last number). A scorer marks an answer correct by ``acc`` (or its score at the maximum).

- A constant answer (``0``, ``1``, ``-1``, ``2``, the empty answer -- i.e. the format alone: ``#### ``,
  ``\\boxed{}``, ``Answer: `` --, ``\\boxed{}`` inside the format, the prompt echoed, 1 MB of text) must be scored
  correct on exactly the rows whose gold equals it (exact string or number comparison, computed here): so its share
  correct equals that base rate. Bare format markers (``#### ``, ``\\boxed{ }``, ``Answer:``) and 1 MB of text with
  no marker are probed too.
- A hedge (``\\boxed{g \\text{ or } h}``, ``g, h``, ``[g, h]``, ``(g, h)``, ``\\{g, h\\}``, ``g \\pm 1``, two answer
  markers, "the answer is g or h"; g the gold, h a wrong value, both orders) must be scored wrong: no gold here is
  such a set.

``pytest -s`` prints the table scorer x answer -> share scored correct (base rate in brackets where not zero).
The default run subsamples rows deterministically (~20 s on 2 cores); the ``slow`` run takes every row and also
wraps 1 MB of prose in each format (each such call is timed: a scorer that parses it symbolically takes seconds).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import pytest

from core.rewards.code_tests import SOURCES as CODE_SOURCES
from tests.rewards import answers as A, exact as E, golds as G, references as R

# the format each registered data source wants (a name not listed here is probed in the \boxed{} format)
FORMAT_OF = {"openai/gsm8k": "gsm8k", "gsm8k": "gsm8k", "gsm8k_format": "gsm8k", "gsm8k_flexible": "plain",
             "hybridrl/arith": "plain", "hybridrl/agent_mult": "plain", "math_dapo": "dapo", "dapo": "dapo"}
# recipe -> the data sources its reward file handles (beyond plain delegation to core), and the format of each
RECIPES = {
    "agent": [("math_dapo", "retool"), ("aime24", "retool")],
    "dapo": [("openai/gsm8k", "gsm8k"), ("math_dapo", "dapo"), ("aime24", "dapo")],
    "grpo": [("openai/gsm8k", "gsm8k")],
    "ppo": [("openai/gsm8k", "gsm8k")],
    "prime": [("openai/gsm8k", "gsm8k"), ("math", "boxed"), ("numina_olympiads", "boxed")],
    "sppo": [("lighteval/MATH", "boxed"), ("minerva_math", "boxed")],
    "vapo": [("openai/gsm8k", "gsm8k"), ("math_dapo", "dapo"), ("aime24", "dapo")],
    "vlm": [("hiyouga/geometry3k", "geo3k")],
}
MARKERS = {"gsm8k": "#### ", "plain": "", "boxed": "\\boxed{ }", "dapo": "Answer:", "dapo_boxed": "Answer:",
           "geo3k": "<think></think> \\boxed{ }", "retool": "\\boxed{ }"}

NUMBERS = ("0", "1", "-1", "2")
HUGE_TEXT = ("and so we keep going, checking each case again " * 25000)[:1_000_000]
HUGE_DIGITS = ("1234567890 " * 100000)[:1_000_000]

ROWS = {"gsm8k": 14, "minerva_math": 18, "aime24": 8, "amc23": 12}  # default run: rows per data set
HEDGE_ROWS = 2       # rows per data set that get every hedge (default run)
ECHO_ROWS = 2        # rows per data set that get the prompt echoed (default run)


@dataclass(frozen=True)
class Scorer:
    name: str
    fn: Callable       # verl signature
    source: str
    fmt: str


def scorers(every_name: bool = False) -> list[Scorer]:
    """One Scorer per registered function (every registered name when ``every_name``), then the recipes'."""
    from core.rewards import REWARDS

    out, seen = [], {}
    for name in REWARDS.names():
        if name in CODE_SOURCES:  # scores programs against unit tests, not answers against these golds
            continue  # (its constant programs: tests/rewards/test_code_tests.py)
        fn = REWARDS[name]
        if not every_name and id(fn) in seen:
            seen[id(fn)].append(name)
            continue
        seen[id(fn)] = [name]
        out.append(Scorer(name, fn, name, FORMAT_OF.get(name, "boxed")))
    out = [Scorer(_alias_name(seen[id(s.fn)]) if not every_name else s.name, s.fn, s.source, s.fmt) for s in out]
    for recipe, sources in RECIPES.items():
        fn = R.recipe_reward(recipe)
        out += [Scorer(f"recipes/{recipe}: {src}", fn, src, fmt) for src, fmt in sources]
    return out


def _alias_name(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]} (+{len(names) - 1} names: same function)"


def gold_equals(gold: str, answer: str) -> bool:
    """The base rate's test, independent of any scorer: the same string, or the same number exactly."""
    if gold.strip() == answer.strip():
        return True
    n = E.read_number(gold)
    try:
        return n is not None and answer.strip() != "" and n.value == Fraction(answer.strip())
    except ValueError:
        return False


@contextmanager
def quiet_math_verify():
    """math-verify logs the whole text it failed to parse (1 MB here): silenced while probing."""
    loggers = [logging.getLogger(n) for n in ("math_verify", "math_verify.parser", "math_verify.grader",
                                               "latex2sympy2_extended")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


def rows_of(dataset: str, n: int | None) -> list[dict]:
    rows = G.load_rows(dataset)
    golds = G.load_golds(dataset)
    # stratified: rows whose gold equals a probed constant, and rows with a tiny gold (|g| < 1e-3, where an absolute
    # tolerance would accept 0), then a seeded sample of the rest
    equal = [i for i, g in enumerate(golds) if any(gold_equals(g, c) for c in NUMBERS)][:6]
    tiny = [i for i, g in enumerate(golds) if (v := E.read_number(g)) and 0 < abs(v.value) < Fraction(1, 1000)][:3]
    must = tuple(dict.fromkeys(equal + tiny))
    return [rows[i] | {"_gold": golds[i]} for i in G.subsample(len(rows), n, must=must)]


def probes(s: Scorer, row: dict, dataset: str, i: int, full: bool) -> list[tuple[str, str, str]]:
    """(probe name, response, the answer the base rate compares) for one scorer and row."""
    out = [(c, A.wrap(s.fmt, c), c) for c in NUMBERS]
    out.append(("empty (format only)", A.wrap(s.fmt, ""), ""))
    out.append(("\\boxed{} in format", A.wrap(s.fmt, "\\boxed{}"), "\\boxed{}"))
    out.append(("bare marker", MARKERS[s.fmt], ""))
    out.append(("empty string", "", ""))
    out.append(("1 MB, no marker", HUGE_TEXT, HUGE_TEXT))
    if full or i < ECHO_ROWS:
        q = G.question_of(row)
        out.append(("prompt echoed", A.wrap(s.fmt, q), q))
    if full or (i == 0 and dataset == "gsm8k"):
        out.append(("1 MB digits in format", A.wrap(s.fmt, HUGE_DIGITS), HUGE_DIGITS))
    if full:
        out.append(("1 MB prose in format", A.wrap(s.fmt, HUGE_TEXT), HUGE_TEXT))
    return out


def hedges(s: Scorer, gold: str) -> list[tuple[str, str]]:
    out = [(f.kind.removeprefix("hedge."), A.wrap(s.fmt, f.body)) for f in A.forms(gold) if f.kind.startswith("hedge.")]
    out.append(("prose", f"{A.PREFIXES[0]}\nThe answer is {A._as_written(gold)} or {A._alt(gold)}."))
    return out


def run_probe(full: bool):
    missing = [d for d in G.DATASETS if G.data_missing(d)]
    if len(missing) == len(G.DATASETS):
        pytest.skip(G.data_missing(missing[0]))
    sc = scorers(every_name=full)
    # scorer name -> probe name -> [accepted, expected, total]
    table: dict[str, dict[str, list[int]]] = {s.name: {} for s in sc}
    wrong_const, wrong_hedge, slow = [], [], []
    with quiet_math_verify():
        for dataset in G.DATASETS:
            if G.data_missing(dataset):
                continue
            rows = rows_of(dataset, None if full else ROWS[dataset])
            for s in sc:
                for i, row in enumerate(rows):
                    gold = row["_gold"]
                    for name, response, answer in probes(s, row, dataset, i, full):
                        t = time.perf_counter()
                        acc = R.accepted(s.fn(s.source, response, gold, {"num_turns": 1}))
                        dt = time.perf_counter() - t
                        if dt > 1.0:
                            slow.append((s.name, name, dataset, round(dt, 1)))
                        exp = gold_equals(gold, answer)
                        cell = table[s.name].setdefault(name, [0, 0, 0])
                        cell[0] += acc
                        cell[1] += exp
                        cell[2] += 1
                        if acc != exp:
                            wrong_const.append((s.name, name, dataset, gold, _tail(response), acc))
                    if full or i < HEDGE_ROWS:
                        for name, response in hedges(s, gold):
                            acc = R.accepted(s.fn(s.source, response, gold, {"num_turns": 1}))
                            cell = table[s.name].setdefault("hedge: " + name.split(".")[0], [0, 0, 0])
                            cell[0] += acc
                            cell[2] += 1
                            if acc:
                                wrong_hedge.append((s.name, name, dataset, gold, _tail(response)))
    return table, wrong_const, wrong_hedge, slow


def _tail(response: str, n: int = 60) -> str:
    """The end of a response, where the answer is (the reasoning prefix is the same everywhere)."""
    r = response.replace("\n", "\\n")
    return r if len(r) <= n else "..." + r[-n:]


def render(table) -> str:
    probes_seen = list(dict.fromkeys(p for row in table.values() for p in row))
    rows = []
    for s, cells in table.items():
        r = [s]
        for p in probes_seen:
            if p not in cells:
                r.append("")
                continue
            acc, exp, n = cells[p]
            mark = "" if acc == exp else " **!**"
            base = f" [{exp / n:.3f}]" if exp else ""
            r.append(f"{acc / n:.3f}{base}{mark}")
        rows.append(r)
    return R.markdown(["scorer", *probes_seen], rows)


def check(full: bool):
    t = time.perf_counter()
    table, wrong_const, wrong_hedge, slow = run_probe(full)
    print(f"\n== hacking probe ({'full' if full else 'default'} run, {time.perf_counter() - t:.1f} s): share of "
          f"answers scored correct [base rate where not 0]; **!** = differs from the base rate (constants) or not 0 "
          f"(hedges)\n" + render(table))
    msgs = []
    if wrong_const:
        msgs.append(f"{len(wrong_const)} constant answers scored differently from 'gold equals it':")
        msgs += [f"  {w[0]} | {w[1]!r} on {w[2]} gold {w[3]!r}: {'accepted' if w[5] else 'rejected'} ...{w[4]!r}"
                 for w in _first_per(wrong_const, key=lambda w: (w[0], w[1], w[5]))]
    if wrong_hedge:
        msgs.append(f"{len(wrong_hedge)} hedged answers scored correct:")
        msgs += [f"  {w[0]} | {w[1]} on {w[2]} gold {w[3]!r}: accepted {w[4]!r}"
                 for w in _first_per(wrong_hedge, key=lambda w: (w[0], w[1]), k=1)]
    if slow:
        print("calls over 1 s:", slow[:20])
    if msgs:
        print("\n".join(msgs))
    assert not msgs, "\n".join(msgs[:60])


def _first_per(items, key, k=2):
    seen: dict = {}
    out = []
    for it in items:
        kk = key(it)
        if seen.get(kk, 0) < k:
            seen[kk] = seen.get(kk, 0) + 1
            out.append(it)
    return out


def test_constant_and_hedged_answers_score_at_most_the_base_rate():
    check(full=False)


@pytest.mark.slow  # every row, and 1 MB of prose in every format: each such call takes ~5 s in a scorer that
def test_constant_and_hedged_answers_every_row():  # parses it symbolically -- hours (CI runs `heavy`, not `slow`)
    check(full=True)
