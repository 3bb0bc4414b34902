"""A name -> function table with one fixed signature, so config can pick an entry by name.

Every entry must take exactly the registry's parameters (extra inputs are named batch keys, asserted inside)
and carry a docstring with the math, the paper, tensor shapes and a worked example.
"""

from __future__ import annotations

import inspect
from typing import Callable, Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    def __init__(self, kind: str, params: tuple[str, ...]):
        self.kind, self.params = kind, params
        self._entries: dict[str, F] = {}

    def register(self, *names: str) -> Callable[[F], F]:
        def add(fn: F) -> F:
            got = tuple(inspect.signature(fn).parameters)
            if got != self.params:
                raise TypeError(f"{self.kind} {fn.__name__}{got}: every {self.kind} takes exactly {self.params}")
            if not (fn.__doc__ or "").strip():
                raise TypeError(f"{self.kind} {fn.__name__} needs a docstring (math, paper, shapes, example)")
            for name in names:
                if name in self._entries:
                    raise KeyError(f"{self.kind} {name!r} is registered twice")
                self._entries[name] = fn
            return fn

        return add

    def __getitem__(self, name: str) -> F:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}; known: {sorted(self._entries)}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def names(self) -> list[str]:
        return sorted(self._entries)
