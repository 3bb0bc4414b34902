"""A user's config mistake as an answer: ``ConfigError`` names the key, and ``where_set`` says where its value came
from (the command line, or the yaml file and line), so the CLI can print one line instead of a traceback.

    hybridrl: actor.optim.lrr: unknown key; did you mean 'lr'? (set on the command line: actor.optim.lrr=1e-6)
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Callable, Iterable


class ConfigError(ValueError):
    """A config value a run cannot start with. ``key``: the dotted key it concerns (``actor.optim.lr``), when one
    does; the message names it and the fix. The CLI prints the message alone (``--debug``: the traceback)."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'lr'?"`` when one of ``choices`` is close to ``name`` (difflib's ratio >= 0.6), else ""."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def override_key(override: str) -> str:
    """The dotted key of a Hydra override: ``++actor.optim.lr=1e-6`` -> ``actor.optim.lr``."""
    return override.split("=", 1)[0].lstrip("+~")


def where_set(key: str, overrides: Iterable[str], yaml_path: str | Path | None) -> str:
    """Where the value at ``key`` (or the section holding it) was given: ``"set on the command line: k=v"``,
    ``"set in <file>:<line>"``, or ``"core's default"`` when neither names it."""
    def covers(k: str) -> tuple[int, int] | None:  # the key itself, then the closest section holding it, then a part
        if k == key:
            return 3, 0
        if key.startswith(k + "."):
            return 2, len(k)
        return (1, -len(k)) if k.startswith(key + ".") else None

    # the override that gave the value: the most specific, the last of equals (Hydra applies them in order)
    ranked = [(covers(override_key(o)), i, o) for i, o in enumerate(overrides)]
    ranked = [r for r in ranked if r[0] is not None]
    if ranked:
        return f"set on the command line: {max(ranked)[2].lstrip('+')}"
    line = yaml_line(yaml_path, key) if yaml_path else None
    if line is not None:
        return f"set in {yaml_path}:{line}"
    return "core's default"


def yaml_line(path: str | Path, key: str) -> int | None:
    """The 1-based line of ``key`` (dotted) in the yaml file, or None where the file does not spell it out."""
    import yaml

    try:
        node = yaml.compose(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None
    line = None
    for part in key.split("."):
        match = next(((k, v) for k, v in node.value if getattr(k, "value", None) == part), None) \
            if isinstance(node, yaml.MappingNode) else None
        if match is None:
            return None  # the file does not spell this key out
        line, node = match[0].start_mark.line + 1, match[1]
    return line


_LEADING_KEY = re.compile(r"^(?:- )?([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)+)(?==|:| )")


def with_sources(error: ConfigError, overrides: Iterable[str], yaml_path: str | Path | None) -> ConfigError:
    """``error`` with where each of its lines' leading key was set appended to the line (one problem per line)."""
    overrides = list(overrides)
    lines = []
    for line in str(error).split("\n"):
        m = _LEADING_KEY.match(line)
        key = error.key if error.key and line.lstrip("- ").startswith(error.key) else (m.group(1) if m else None)
        lines.append(f"{line} ({where_set(key, overrides, yaml_path)})" if key else line)
    return ConfigError("\n".join(lines), error.key)


def answer_user_errors(main: Callable[[list[str]], int], argv: list[str], prog: str = "hybridrl") -> int:
    """Run a CLI's ``main(argv)``; a user's mistake (``ConfigError``, a Hydra override that does not parse) is
    printed as ``<prog>: <message>`` on stderr with exit code 2, no traceback -- ``--debug`` anywhere in ``argv``
    (or ``HYBRIDRL_DEBUG=1``) lets it raise with its traceback."""
    import os
    import sys

    debug = "--debug" in argv or os.environ.get("HYBRIDRL_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    try:
        return main(argv)
    except Exception as e:
        if debug or not _is_user_error(e):
            raise
        print(f"{prog}: {_user_message(e)}", file=sys.stderr)
        return 2


def _is_user_error(e: Exception) -> bool:
    if isinstance(e, ConfigError):
        return True
    module = type(e).__module__ or ""
    return module.startswith(("hydra.", "omegaconf.")) and type(e).__name__ in (
        "OverrideParseException", "ConfigCompositionException", "MissingConfigException", "InterpolationResolutionError",
        "InterpolationKeyError", "GrammarParseError")


def _user_message(e: Exception) -> str:
    if isinstance(e, ConfigError):
        return str(e)
    text = " ".join(str(e).split())
    return f"the command line or config does not parse: {text}"
