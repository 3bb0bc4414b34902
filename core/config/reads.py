"""Which config keys a run reads, recorded as it reads them -- and the keys a user set that nothing read.

A key set in a yaml or on the command line that no code reads is a silent mistake: a GPU count on a CPU pool, a
critic section in a run without a critic, a vLLM-only option given to the embedded engine. Rather than a hand-kept
list of which key matters when, the run records every config field read:

- ``label(cfg)`` gives each section object its dotted key (``rollout``, ``placement.pools.main``), kept in the
  object's ``__dict__`` so it survives pickling into the workers;
- ``start()`` installs, on the config classes, an attribute hook that adds ``<key>.<field>`` to this process's
  set on every field read; ``stop()`` removes it and returns the set. The driver records from its set-up through
  the first step; each worker from building its roles through that step (``WorkerHost.config_reads``);
- ``unread(given, read)``: the keys given that were read nowhere, nor by an interpolation (``${trainer.nnodes}``).

Reads made to check or copy a config (``core.checks``, ``dataclasses.asdict``) are not uses: they run in
``paused()``. A copy (``dataclasses.replace``) reads every field it copies, so a key can only be missed, never
wrongly reported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import keyword
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

_KEY = "_config_key"  # the instance attribute holding a section's dotted key
_state = {"on": 0, "paused": 0}
_read: set[str] = set()
_hooked: set[type] = set()
_fields: dict[type, frozenset[str]] = {}


def label(section: Any, key: str = "") -> None:
    """Write each section's dotted key into it (and its sub-sections', and those in dicts: pools)."""
    if dataclasses.is_dataclass(section) and not isinstance(section, type):
        object.__setattr__(section, _KEY, key)
        for f in dataclasses.fields(section):
            label(object.__getattribute__(section, f.name), f"{key}.{_yaml_key(f.name)}" if key else _yaml_key(f.name))
    elif isinstance(section, dict):
        for k, v in section.items():
            label(v, f"{key}.{k}")


def _classes(obj: Any, out: set[type]) -> set[type]:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type) and _KEY in vars(obj):
        out.add(type(obj))
        for f in dataclasses.fields(obj):
            _classes(object.__getattribute__(obj, f.name), out)
    elif isinstance(obj, (dict, list, tuple)):
        for v in obj.values() if isinstance(obj, dict) else obj:
            _classes(v, out)
    return out


def _yaml_key(name: str) -> str:
    return name[:-1] if keyword.iskeyword(name[:-1]) else name  # the field async_ is the key async


def _is_section(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_is_section(v) for v in value.values())
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _record(self, name: str) -> Any:
    value = object.__getattribute__(self, name)
    # a section (or a dict of them: placement.pools) is not used by being reached; its own fields record their reads
    if _state["on"] and not _state["paused"] and name in _fields[type(self)] and not _is_section(value):
        key = object.__getattribute__(self, "__dict__").get(_KEY)
        if key is not None:
            _read.add(f"{key}.{_yaml_key(name)}" if key else _yaml_key(name))
    return value


def start(*roots: Any) -> None:
    """Record reads of the labelled sections in ``roots`` (and of every labelled object of their classes)."""
    for cls in _classes(roots, set()) - _hooked:
        _fields[cls] = frozenset(f.name for f in dataclasses.fields(cls))
        cls.__getattribute__ = _record
        _hooked.add(cls)
    _state["on"] = 1


def stop() -> set[str]:
    """Stop recording, take the hooks off (reads cost nothing again) and return the keys read since ``start``."""
    for cls in _hooked:
        del cls.__getattribute__
    _hooked.clear()
    _state["on"] = 0
    keys = set(_read)
    _read.clear()
    return keys


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Reads inside are not uses: a check reading a section to validate it, ``asdict`` writing config.json."""
    _state["paused"] += 1
    try:
        yield
    finally:
        _state["paused"] -= 1


def given_keys(tree: Any, key: str = "") -> set[str]:
    """The dotted leaf keys of a config tree as a user wrote it (a yaml's or the command line's)."""
    if isinstance(tree, dict) and tree:
        return set().union(*(given_keys(v, f"{key}.{k}" if key else str(k)) for k, v in tree.items()
                             if k not in ("defaults", "hydra")))
    return {key} if key else set()


def interpolated(tree: Any) -> set[str]:
    """The keys an unresolved tree's ``${...}`` interpolations read."""
    if isinstance(tree, dict):
        return set().union(set(), *(interpolated(v) for v in tree.values()))
    if isinstance(tree, (list, tuple)):
        return set().union(set(), *(interpolated(v) for v in tree))
    return set(re.findall(r"\$\{([a-zA-Z_][\w.]*)\}", tree)) if isinstance(tree, str) else set()


def unread(given: Iterable[str], read: Iterable[str]) -> list[str]:
    """The keys of ``given`` that nothing read: neither the key, nor a section above it read as a whole, nor a key
    below it (a dict-valued key like ``trainer.runtime_env`` is read as one value)."""
    read = set(read)
    above = {".".join(k.split(".")[:i]) for k in read for i in range(1, k.count(".") + 1)}

    def was_read(key: str) -> bool:
        parts = key.split(".")
        return key in above or any(".".join(parts[:i]) in read for i in range(1, len(parts) + 1))

    return sorted(k for k in given if not was_read(k))


@dataclass(frozen=True)
class Given:
    """What the user set, to hold a run's reads against: the leaf keys of its yamls and command line, the keys their
    interpolations read, and where each was set (for the warning)."""

    keys: frozenset[str]
    interpolated: frozenset[str] = frozenset()
    overrides: tuple[str, ...] = ()
    # the yaml files composed, the named one first
    yaml_paths: tuple[str, ...] = ()
    # a recipe's own sections ({"dapo": DAPOConfig(...)}), recorded like the run config's
    sections: dict[str, Any] = field(default_factory=dict)

    def warnings(self, read: Iterable[str]) -> list[str]:
        """One line per key set that nothing read: the key, where it was set, and what that means."""
        from core.config.errors import where_set

        def where(key: str) -> str:
            places = [where_set(key, self.overrides, p) for p in self.yaml_paths or [None]]
            return next((p for p in places if p != "core's default"), places[0])

        return [f"{k}: set, but nothing in this run reads it, so it changes nothing ({where(k)})"
                for k in unread(self.keys, set(read) | self.interpolated)]
