"""The scorers under test and their references for the reward tests: ours (``core.rewards`` and the recipes'
``reward.py`` files), verl 0.9.1's own scorers loaded from the installed wheel, math-verify; and the report helpers
(records, classes of disagreements, markdown tables). The generated answers are in ``answers.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tests.rewards.answers import Pair


# ---------------------------------------------------------------------------------------- the scorers under test

def accepted(result, top: float = 1.0) -> bool:
    """A scorer's verdict: ``acc`` where the result has it, else the score at its maximum ``top``."""
    if isinstance(result, dict):
        if "acc" in result:
            return bool(result["acc"])
        result = result["score"]
    return float(result) >= top


def ours(data_source: str, response: str, gold: str, extra_info: dict | None = None):
    from core.rewards import default_compute_score

    return default_compute_score(data_source, response, gold, extra_info)


REPO = Path(__file__).resolve().parents[2]


@lru_cache(maxsize=None)
def recipe_reward(recipe: str):
    """``recipes/<recipe>/reward.py``'s compute_score, through the public loader."""
    from core.rewards import load_reward_fn

    return load_reward_fn(REPO / "recipes" / recipe / "reward.py")


# --------------------------------------------------------------------------------- the references: verl, Math-Verify

_VERL_PKG = "_hybridrl_verl_reward_score"


@lru_cache(maxsize=None)
def _verl_package():
    """verl's ``verl/utils/reward_score`` package, loaded from the installed wheel under a private name, so that
    verl's own ``__init__`` (DataProto: torch, tensordict, ray, ...) never runs. Its few absolute ``verl.*`` imports
    (``verl.utils.import_utils`` in the package, ``verl.utils.py_functional`` in prime_math) resolve through
    namespace stand-ins for ``verl`` and ``verl.utils`` that exist only while a module loads. Raises ImportError
    (with the reason) when verl is not installed."""
    import importlib.util
    import sys

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("verl is not installed (pip install --no-deps verl==0.9.1)")
    root = Path(list(spec.submodule_search_locations)[0])
    rs = root / "utils" / "reward_score"
    if not (rs / "__init__.py").is_file():
        raise ImportError(f"the installed verl has no {rs}")
    pkg_spec = importlib.util.spec_from_file_location(_VERL_PKG, rs / "__init__.py",
                                                      submodule_search_locations=[str(rs)])
    pkg = importlib.util.module_from_spec(pkg_spec)
    sys.modules[_VERL_PKG] = pkg
    with _verl_namespace(root):
        pkg_spec.loader.exec_module(pkg)
    return pkg


class _verl_namespace:
    """While active: ``verl`` and ``verl.utils`` are bare namespace modules over the wheel's folders (no __init__
    runs); afterwards every ``verl*`` module added meanwhile is dropped from sys.modules again."""

    def __init__(self, root: Path):
        self.root = root

    def __enter__(self):
        import sys
        import types

        self.before = {k for k in sys.modules if k == "verl" or k.startswith("verl.")}
        if "verl" not in sys.modules:
            for name, path in (("verl", self.root), ("verl.utils", self.root / "utils")):
                m = types.ModuleType(name)
                m.__path__ = [str(path)]
                sys.modules[name] = m

    def __exit__(self, *exc):
        import sys

        for k in [k for k in sys.modules if (k == "verl" or k.startswith("verl.")) and k not in self.before]:
            del sys.modules[k]


@lru_cache(maxsize=None)
def verl_module(name: str):
    """``verl.utils.reward_score.<name>`` of the installed verl (gsm8k, math_reward, math_dapo, geo3k, prime_math,
    ...); ImportError with the reason when it cannot load (verl missing, or a dependency such as mathruler)."""
    import importlib

    pkg = _verl_package()
    with _verl_namespace(Path(pkg.__path__[0]).parents[1]):
        return importlib.import_module(f"{_VERL_PKG}.{name}")


def verl_default_compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's own dispatcher (``verl.utils.reward_score.default_compute_score``)."""
    pkg = _verl_package()
    with _verl_namespace(Path(pkg.__path__[0]).parents[1]):  # its lazy imports may need verl.* (prime_math)
        return pkg.default_compute_score(data_source, solution_str, ground_truth, extra_info)


def math_verify_accepts(gold: str, response: str) -> bool:
    """Math-Verify's verdict on a whole response: ``verify(parse(gold), parse(response))``, the gold parsed as
    ``\\boxed{gold}`` (verl's math_verify convention; a bare ``parse(gold)`` misreads LaTeX golds such as
    ``\\sqrt{2} \\cos (2 t-\\pi / 4)`` as ``4``), or as given when that yields no expression (``-1./3``)."""
    from math_verify import parse, verify

    g = parse(f"\\boxed{{{gold}}}")
    if len(g) < 2:  # [expression, string] when it parsed; [string] or [] when not
        g = parse(gold) or g
    a = parse(response)
    return bool(g and a and verify(g, a))


def missing_module(name: str) -> str | None:
    """None when ``name`` imports, else a skip reason."""
    import importlib

    try:
        importlib.import_module(name)
    except ImportError as e:
        return f"{name} is not installed ({e})"
    return None


# ---------------------------------------------------------------------------------------------------------- reports

OUTCOMES = ("agree", "ours-better", "theirs-better", "both-wrong")


@dataclass(frozen=True)
class Record:
    pair: Pair
    ours: bool    # our scorer accepted the answer
    theirs: bool  # the reference accepted it

    @property
    def outcome(self) -> str:
        """Against the pair's known label: both right, only ours right, only theirs right, both wrong."""
        o, t = self.ours == self.pair.label, self.theirs == self.pair.label
        return OUTCOMES[0] if o and t else OUTCOMES[1] if o else OUTCOMES[2] if t else OUTCOMES[3]


def markdown(header: list[str], rows: list[list]) -> str:
    cell = lambda c: str(c).replace("|", "\\|")  # noqa: E731  (a '|' inside a cell would split it)
    out = ["| " + " | ".join(map(cell, header)) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(map(cell, r)) + " |" for r in rows]
    return "\n".join(out)


def short(s: str, n: int = 70) -> str:
    s = s.replace("\n", "\\n")
    return s if len(s) <= n else s[: n - 3] + "..."


def by_class(records, keep=lambda r: True, key=lambda r: r.pair.cls) -> dict[str, list[Record]]:
    """Records grouped by ``key`` (``Pair.cls``), largest group first."""
    groups: dict[str, list[Record]] = {}
    for r in records:
        if keep(r):
            groups.setdefault(key(r), []).append(r)
    return dict(sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])))


def class_lines(groups: dict[str, list[Record]], ours_name: str = "ours", theirs_name: str = "theirs",
                k: int = 3) -> list[str]:
    """One line per class (count, label) and ``k`` examples: gold, answer, both verdicts."""
    lines = []
    for cls, rs in groups.items():
        lines.append(f"  {cls}  x{len(rs)}  (label: {'right' if rs[0].pair.label else 'wrong'})")
        seen = set()
        for r in rs:
            if r.pair.gold in seen:
                continue
            seen.add(r.pair.gold)
            lines.append(f"      gold {short(r.pair.gold, 40)!r:44} answer {short(r.pair.body, 60)!r:64} "
                         f"{ours_name}={'acc' if r.ours else 'rej'} {theirs_name}={'acc' if r.theirs else 'rej'}")
            if len(seen) >= k:
                break
    return lines


def known_class(known: dict, pair: Pair) -> str | None:
    """The name of the first ``known`` class (name -> (predicate(pair) or example class string, reason)) that
    ``pair`` falls in."""
    for name, (pred, _reason) in known.items():
        if (pred(pair) if callable(pred) else pair.cls == pred):
            return name
    return None
