"""Ranges of sizes, counts, rates and probabilities, written in a field's type and checked by ``validate``:

    n: PositiveInt = 1              # data.prompts_per_step=-8 -> "data.prompts_per_step: must be >= 1, got -8"
    top_p: UnitOpen = 1.0           # (0, 1]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated


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
