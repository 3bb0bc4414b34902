"""Every ``core.…`` dotted name and every repository path (``core/…``, ``recipes/…``, ``tests/…``, ``bench/…``) that
the README, the recipes' READMEs, the docs and the code's docstrings and comments mention exists: a name that was
renamed or removed fails here, not in a reader's hands."""

from __future__ import annotations

import importlib
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOTTED = re.compile(r"(?<![\w./-])core(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w./-])((?:core|recipes|tests|bench)/[\w./-]+\.(?:py|yaml|sh|md))")


def _texts() -> list[Path]:
    docs = [ROOT / "README.md", *ROOT.glob("recipes/*/README.md"), *ROOT.glob("docs/**/*.md")]
    code = [p for p in (*ROOT.glob("core/**/*.py"), *ROOT.glob("recipes/**/*.py")) if "__pycache__" not in p.parts]
    return [p for p in docs + code if p.is_file()]


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _git(*args: str) -> list[str]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.splitlines()


def _paths_exist(paths: set[str]) -> set[str]:
    """The paths a clean checkout has: tracked files, and the outputs ``.gitignore`` names (a run writes those). A file
    that exists only in a working tree does not count, so the check reads the same here and on a fresh clone."""
    tracked = set(_git("ls-files"))
    if not tracked:  # not a git checkout: what exists is all there is to go on
        return {p for p in paths if (ROOT / p).exists()}
    ignored = set(_git("check-ignore", "--no-index", *sorted(paths))) if paths else set()
    return {p for p in paths if p in tracked or p in ignored}


def test_every_core_name_and_path_the_docs_mention_exists():
    missing: dict[str, set[str]] = {}
    mentioned: dict[str, set[str]] = {}
    for path in _texts():
        text = path.read_text()
        for m in DOTTED.finditer(text):
            if not _resolves(m.group(0).rstrip(".")):
                missing.setdefault(m.group(0), set()).add(str(path.relative_to(ROOT)))
        for m in PATH.finditer(text):
            mentioned.setdefault(m.group(1), set()).add(str(path.relative_to(ROOT)))
    for name in set(mentioned) - _paths_exist(set(mentioned)):
        missing[name] = mentioned[name]
    assert not missing, "\n".join(f"{name}: in {sorted(where)}" for name, where in sorted(missing.items()))


def test_the_check_can_fail():
    assert not _resolves("core.worker_group.RefPolicy") and not _resolves("core.no_such_module.x")
    assert _resolves("core.worker_group.RoleGroup.call_rank0") and _resolves("core.rewards.REWARDS")
    assert _paths_exist({"core/trainer.py", "bench/results/report.md", "core/no_such_file.py"}) == {
        "core/trainer.py",
        "bench/results/report.md",
    }
