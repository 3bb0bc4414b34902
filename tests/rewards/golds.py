"""The gold answers the reward-scorer tests generate answers for: the shared data sets read in place
(``../shared/data/<name>/test.jsonl``, ``DATA_DIR``, never copied), ``data_missing(name)`` saying why one cannot be
used (tests skip with it), seeded subsamples, and ``SYNTHETIC``: MATH-style golds the four sets lack (fractions,
radicals, intervals, base-2 numerals, lists), generated from a fixed seed."""

from __future__ import annotations
import json
import random
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
