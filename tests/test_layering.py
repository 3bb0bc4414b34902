"""The layering as a contract (``[tool.importlinter]`` in pyproject.toml, checked by import-linter): core never imports
a recipe, no recipe imports another, the training and rollout engines import neither each other nor the driver, no
import cycles in core. import-linter sees modules, not names, so a recipe's use of a ``_private`` name of core is
checked here by reading the recipes' imports."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"]


def lint(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": f"{cwd}{os.pathsep}{ROOT}"}
    return subprocess.run([*LINT, "--no-cache", *args], cwd=cwd, env=env, capture_output=True, text=True)


def test_the_import_contracts_hold():
    run = lint(ROOT)
    assert run.returncode == 0, run.stdout[-3000:]
    assert run.stdout.count(" KEPT") == 5, run.stdout


def test_a_recipe_that_imports_another_breaks_the_contract(tmp_path):
    """Two recipes, one importing the other, under the project's own contracts: import-linter says which."""
    for name in ("alpha", "beta"):
        (tmp_path / "recipes" / name).mkdir(parents=True)
        (tmp_path / "recipes" / name / "__init__.py").write_text("")
    (tmp_path / "recipes" / "__init__.py").write_text("")
    (tmp_path / "recipes" / "beta" / "train.py").write_text("from recipes.alpha import reward\n")
    (tmp_path / "recipes" / "alpha" / "reward.py").write_text("from core.protocol import Batch\n")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    run = lint(tmp_path)
    assert run.returncode == 1, run.stdout[-3000:]
    assert "a recipe is self-contained: none imports another BROKEN" in run.stdout
    assert "recipes.beta.train -> recipes.alpha.reward" in run.stdout


def _private_uses(path: Path) -> list[str]:
    """``from core.… import _name`` and ``core.…._name`` in a recipe's source."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("core"):
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
            found += [node.module] if any(p.startswith("_") for p in node.module.split(".")) else []
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("core") and re.search(r"\._", a.name)]
    return found


def test_recipes_import_no_private_name_of_core(tmp_path):
    uses = {str(p.relative_to(ROOT)): u for p in ROOT.glob("recipes/**/*.py") if (u := _private_uses(p))}
    assert not uses, uses
    bad = tmp_path / "train.py"
    bad.write_text("from core.run import _ABSENT\nfrom core.loop import step\n")
    assert _private_uses(bad) == ["core.run._ABSENT"]
