"""Reward scorers' speed: calls/s of ours against math-verify alone (``verify(parse(gold), parse(response))``, as a
user calls it), in the same run, on the shared data's golds (``../shared/data``) with right answers and distinct
wrong ones (no two calls alike: no cache of answers can fake it; ours parses each gold once per process, as
intended; math-verify gets the gold in ``$...$``, without which it reads 5% of the symbolic golds). The MATH scorer is measured on golds our number reader reads (190 of Minerva's 272, all of AIME and AMC)
and on symbolic ones (where math-verify decides, and its LaTeX parser of the answer bounds the rate).

Full size (``--benchmark``): up to 600 calls per row; smoke: 20.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from core.rewards import default_compute_score
from core.rewards.math_answer import last_boxed, normalize
from core.rewards.numbers import parse_number

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _golds() -> dict[str, list[str]]:
    def rows(name):
        return [json.loads(line) for line in (DATA / name / "test.jsonl").read_text().splitlines() if line.strip()]

    math = [last_boxed(r["solution"]) for r in rows("minerva_math")] + [str(r["answer"]) for r in rows("aime24")] \
        + [str(r["answer"]) for r in rows("amc23")]
    return {"gsm8k": [r["answer"].split("####")[-1].strip().replace(",", "") for r in rows("gsm8k")], "math": math,
            "math_numeric": [g for g in math if parse_number(normalize(g)) is not None],
            "math_symbolic": [g for g in math if parse_number(normalize(g)) is None]}


def _wrong(gold: str, k: int) -> str:
    n = parse_number(normalize(gold))
    if n is None:
        return f"{gold} + {k}"
    return f"{float(n.value) * (1 + k / 7) + k:.6g}"


def _cases(golds: list[str], count: int, right: bool) -> list[tuple[str, str]]:
    out, k = [], 0
    while len(out) < count:
        k += 1
        out += [(g, g if right else _wrong(g, k)) for g in golds[:count - len(out)]]
    return out


FORMATS = {"gsm8k": ("openai/gsm8k", "So the answer follows.\n#### {}"),
           "math": ("math", "So the answer is $\\boxed{{{}}}$."),
           "math_numeric": ("math", "So the answer is $\\boxed{{{}}}$."),
           "math_symbolic": ("math", "So the answer is $\\boxed{{{}}}$.")}


@pytest.mark.parametrize("row", ["gsm8k", "math", "math_numeric", "math_symbolic"])
@pytest.mark.parametrize("right", [True, False], ids=["right", "wrong"])
def test_scorer_calls_per_second_against_math_verify(row, right, full_size, report):
    if not DATA.is_dir():
        pytest.skip(f"no shared data at {DATA}")
    mv = pytest.importorskip("math_verify")
    golds = _golds()[row]
    cases = _cases(golds, 600 if full_size else 20, right)
    source, fmt = FORMATS[row]

    t = time.perf_counter()
    ours = [default_compute_score(source, fmt.format(a), g)["acc"] for g, a in cases]
    ours_s = time.perf_counter() - t
    t = time.perf_counter()
    theirs = [bool(mv.verify(mv.parse(f"${g}$"), mv.parse(fmt.format(a)))) for g, a in cases[:max(20, len(cases) // 4)]]
    theirs_s = (time.perf_counter() - t) / len(theirs) * len(cases)  # math-verify on a quarter, scaled: it is slow
    ours_rate, theirs_rate = len(cases) / ours_s, len(cases) / theirs_s
    report(f"reward_scorer_{row}_{'right' if right else 'wrong'}", tracked={"ours_over_math_verify": "higher"},
           calls=len(cases), ours_calls_per_s=ours_rate, math_verify_calls_per_s=theirs_rate,
           ours_over_math_verify=ours_rate / theirs_rate, ours_accepted=sum(ours) / len(ours),
           math_verify_accepted=sum(theirs) / len(theirs))
    if right:
        assert sum(ours) == len(ours), "a gold given back as the answer must score right"
    else:
        assert sum(ours) <= 0.1 * len(ours)
