"""The fast rejection filter for answers that may be equations: ``differ(a, b)`` True only when math-verify cannot
call ``a`` and ``b`` equal (or calls them equal against the mathematics: below), in microseconds.

Two expressions go to ``latex_eval.differ``. An equation against an expression compares the equation's right side:
math-verify does the same when the gold is an assignment (``x = 5`` against ``5``) or the answer is the equation,
and calls an equation unequal to an expression otherwise. Two equations are equal there when their texts match,
when ``lhs - rhs`` match, or when sympy's solutions for their symbols match; each of those needs the same
solution set, so a real root of one that is robustly not a root of the other proves them unequal. The root is
found by Newton's method in one variable at a time (the others at ``latex_eval.POINTS``), bracketed by a sign
change; "robustly" is ``latex_eval``'s rule, with the root's own uncertainty times the other side's slope added to
its error bound. A chain (``a = b = c``) is not read.

Where the mathematics and math-verify part, the mathematics decides: a derivative (``\\frac{dx}{dt}``, ``y'``,
``\\dot{x}``) is a quantity of its own here, where math-verify reads ``\\frac{dx}{dt}`` of a symbol as 0 (so
``\\frac{dx}{dt} = k x - a`` equals ``k x - a = 0`` there) and ``y'`` as ``y``.
"""

from __future__ import annotations

import itertools
import re

from core.rewards import latex_eval as L
from core.rewards.latex_tokens import calls, strip_units, tokens

MAX_VARS = 6        # variables tried per point, in name order
NEWTON_STEPS = 40


class _Seen(L.Point):
    """A point that records the names of the variables read."""

    def __init__(self, k: int):
        super().__init__(k)
        self.names: set[str] = set()

    def __missing__(self, name):
        self.names.add(name)
        return super().__missing__(name)


def _equation(s: str):
    """(lhs, rhs) compiled, for a text with exactly one ``=`` whose trailing unit word math-verify strips from the
    whole; None otherwise."""
    s = strip_units(s)
    found = calls(tokens(s.replace("=", "+")) or []) if s.count("=") == 1 else None
    if found is None or any(len(args) > 1 for args in found.values()):  # f(1) and f(2): one function, two values
        return None
    sides = [L.compiled(t, units=False, opaque=True) for t in s.split("=")]
    return None if None in sides else tuple(sides)


def _gap(eq, point) -> tuple[complex, float] | None:
    """lhs - rhs at ``point``, with its error bound; None where undefined."""
    lhs, rhs = L.run(eq[0], point), L.run(eq[1], point)
    return None if lhs is None or rhs is None else (lhs[0] - rhs[0], lhs[1] + rhs[1])


def _real(g) -> bool:
    return g is not None and abs(g[0].imag) <= g[1] + L.EPS * abs(g[0])


def _at(k: int, values: dict[str, float]) -> L.Point:
    p = L.Point(k)
    p.update(values)
    return p


def _root(eq, k: int, names: tuple[str, ...], start: dict[str, float] | None = None
          ) -> tuple[dict[str, float], float] | None:
    """A real root of ``eq`` near point ``k``, moving one variable (a real gap) or two (a complex one: its real and
    imaginary parts), by Newton's method with central differences; with a radius within which it lies. None when
    Newton's method does not settle on a simple root."""
    x = dict(start) if start else {n: L.Point(k)[n] for n in names}
    for _ in range(NEWTON_STEPS):
        f = _gap(eq, _at(k, x))
        if f is None:
            return None
        cols = []
        for n in names:
            h = 1e-7 * max(1.0, abs(x[n]))
            lo, hi = _gap(eq, _at(k, {**x, n: x[n] - h})), _gap(eq, _at(k, {**x, n: x[n] + h}))
            if lo is None or hi is None:
                return None
            cols.append((hi[0] - lo[0]) / (2 * h))
        if len(names) == 1:  # f real: solve slope * step = f
            det = cols[0].real
            steps = [f[0].real / det] if det else None
        else:  # [Re; Im] of f, a 2 x 2 system
            (a, c), (b, d) = (cols[0].real, cols[0].imag), (cols[1].real, cols[1].imag)
            det = a * d - b * c
            steps = [(d * f[0].real - b * f[0].imag) / det, (a * f[0].imag - c * f[0].real) / det] if det else None
        if not steps:
            return None
        for n, st in zip(names, steps):
            x[n] -= st
        size = max(map(abs, steps))
        if max(map(abs, x.values())) > 1e6:
            return None
        if size <= 1e-13 * max(1.0, *map(abs, x.values())):
            gain = max(abs(col) for col in cols) / abs(det) * len(names)  # ~ the inverse Jacobian's norm
            f = _gap(eq, _at(k, x))
            if f is None:
                return None
            return x, 1e3 * (size + gain * (abs(f[0]) + f[1])) + 1e-12 * max(1.0, *map(abs, x.values()))
    return None


def _bracketed(eq, k: int, x: dict[str, float], radius: float) -> bool:
    """A real gap changes sign across the radius (so a root lies within it); a complex one's root is Newton's."""
    if len(x) != 1:
        return True
    (n, t), = x.items()
    a, b = _gap(eq, _at(k, {n: t - radius})), _gap(eq, _at(k, {n: t + radius}))
    return _real(a) and _real(b) and a[0].real * b[0].real < 0


def _solves_one_not_other(e1, e2, floats: bool) -> bool:
    """A real root of e1 (one variable at a time, at each point) robustly not a root of e2. ``floats``: a decimal in
    either text -- math-verify rounds a solution's floats to 6 places, so e2's own root must lie farther away."""
    for k in range(len(L.POINTS)):
        seen = _Seen(k)
        g = _gap(e1, seen)
        if g is None:
            continue
        names = sorted(n for n in seen.names if "(" not in n and n != "i")[:MAX_VARS]  # symbols there, no calls
        tries = [(n,) for n in names] if _real(g) else list(itertools.combinations(names, 2))
        for vary in tries:
            found = _root(e1, k, vary)
            if found is None or not _bracketed(e1, k, *found):
                continue
            x, radius = found
            if floats and (near2 := _root(e2, k, vary, start=x)) is not None and \
                    max(abs(near2[0][n] - x[n]) for n in x) <= 1e-5 * max(1.0, *map(abs, x.values())):
                continue
            near = [_gap(e2, _at(k, {**x, n: x[n] + dx})) for n in x for dx in (-radius, radius)]
            mid, sides = _gap(e2, _at(k, x)), [L.run(side, _at(k, x)) for side in e2]
            if mid is None or None in near or None in sides:
                continue
            scale = max(1.0, *(abs(r[0]) for r in sides))
            drift = max(abs(v[0] - mid[0]) for v in near) * len(x)  # e2 moves this much across the root's place
            if abs(mid[0]) > L.TOL * scale and abs(mid[0]) > L.SAFETY * (mid[1] + drift):
                return True
    return False


def differ(a: str, b: str) -> bool:
    """True only when ``a`` and ``b`` cannot be equal (module docstring). Examples: ('y = 2x + 3', 'y = 2x + 4')
    -> True; ('2y = 4x + 6', 'y = 2x + 3') -> False (same solutions); ('x = 5', '6') -> True."""
    try:
        na, nb = a.count("="), b.count("=")
        if na == nb == 0:
            return L.differ(a, b)
        if na > 1 or nb > 1:
            return False
        if na + nb == 1:
            eq, other = (a, b) if na else (b, a)
            return L.differ(strip_units(eq).split("=")[1], strip_units(other), units=False)
        ea, eb = _equation(a), _equation(b)
        if ea is None or eb is None:
            return False
        floats = bool(re.search(r"\d\.\d", a + b))
        return _solves_one_not_other(ea, eb, floats) or _solves_one_not_other(eb, ea, floats)
    except Exception:  # never raises: a doubt is "not shown to differ"
        return False
