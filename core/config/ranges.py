"""Ranges of sizes, counts, rates and probabilities, written in a field's type and checked by ``validate``:

    n: PositiveInt = 1              # data.prompts_per_step=-8 -> "data.prompts_per_step: must be >= 1, got -8"
    top_p: UnitOpen = 1.0           # (0, 1]

``check_fields`` checks the same ranges (and ``Literal`` choices) on a config built in Python, from each class's
``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import keyword
import types
import typing
from dataclasses import dataclass
from typing import Annotated

from core.config.errors import did_you_mean


@dataclass(frozen=True)
class Range:
    """``low <= x`` (``low < x`` with ``open_low``) and ``x <= high``; None: unbounded on that side."""
    low: float | None = None
    high: float | None = None
    open_low: bool = False

    def problem(self, x) -> str | None:
        if self.low is not None and (x <= self.low if self.open_low else x < self.low):
            return f"must be {'>' if self.open_low else '>='} {self.low:g}"
        if self.high is not None and x > self.high:
            return f"must be <= {self.high:g}"
        return None


PositiveInt = Annotated[int, Range(1)]              # sizes and counts that must exist: ranks, samples, tokens
Count = Annotated[int, Range(0)]                    # counts where 0 means none / off / all
PositiveFloat = Annotated[float, Range(0, open_low=True)]  # timeouts, learning rates, temperatures of a loss
NonNegative = Annotated[float, Range(0)]            # coefficients, caps and clip widths (0 = off)
Unit = Annotated[float, Range(0, 1)]                # probabilities and discounts: [0, 1]
UnitOpen = Annotated[float, Range(0, 1, open_low=True)]  # top_p, a memory share: (0, 1]


def _yaml_key(name: str) -> str:
    """A field's YAML key: ``async_`` (a Python keyword's field) is ``async``."""
    return name[:-1] if name.endswith("_") and keyword.iskeyword(name[:-1]) else name


def _constraints(tp) -> tuple[bool, tuple[Range, ...], tuple | None]:
    """(None allowed, the Ranges, the Literal choices or None) that a field annotation ``tp`` puts on its value."""
    optional = False
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) != 1:
            return False, (), None  # a union of several types: nothing checked here
        optional, tp = True, args[0]
    ranges: tuple[Range, ...] = ()
    if typing.get_origin(tp) is typing.Annotated:
        ranges = tuple(m for m in tp.__metadata__ if isinstance(m, Range))
        tp = typing.get_args(tp)[0]
    choices = typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else None
    return optional, ranges, choices


_CHECKS: dict[type, tuple] = {}
_NO_DEFAULT = object()


def _problem(key: str, value, optional: bool, ranges: tuple[Range, ...], choices: tuple | None) -> str | None:
    if value is None and optional:
        return None
    if choices is not None and value not in choices:
        return (f"{key}: must be one of {', '.join(map(repr, choices))}, got {value!r}"
                f"{did_you_mean(value, map(str, choices))}")
    for r in ranges:
        try:
            why = r.problem(value)
        except TypeError:
            raise TypeError(f"{key}: expected a number, got {value!r}") from None
        if why is not None:
            return f"{key}: {why}, got {value!r}"
    return None


def _checks(cls: type) -> tuple:
    """``cls``'s constrained fields as (name, yaml key, None allowed, ranges, choices, default), computed once per
    class; ``default`` is the field's plain default when it passes its own check (a value that is it needs none)."""
    checks = _CHECKS.get(cls)
    if checks is None:
        hints = typing.get_type_hints(cls, include_extras=True)  # resolves the module's names (future annotations)
        found = []
        for f in dataclasses.fields(cls):
            optional, ranges, choices = _constraints(hints.get(f.name))
            if ranges or choices is not None:
                key = _yaml_key(f.name)
                ok = f.default is not dataclasses.MISSING and _problem(key, f.default, optional, ranges, choices) is None
                found.append((f.name, key, optional, ranges, choices, f.default if ok else _NO_DEFAULT))
        checks = _CHECKS[cls] = tuple(found)
    return checks


def check_fields(obj) -> None:
    """Check every field of the dataclass instance ``obj`` against its type's ``Literal`` choices and ``Range``s:
    ``ValueError("nnodes: must be >= 1, got 0")``, worded as ``validate`` words them. Each config class's
    ``__post_init__`` calls it first, so a config built in Python (``PoolConfig(nnodes=0)``) is checked as one read
    from YAML is; the ``__post_init__`` keeps only what a type cannot say (rules across fields)."""
    for name, key, optional, ranges, choices, default in _checks(type(obj)):
        value = getattr(obj, name)
        if value is not default and (why := _problem(key, value, optional, ranges, choices)) is not None:
            raise ValueError(why)
