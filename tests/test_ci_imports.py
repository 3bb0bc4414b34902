"""In CI a dev dependency that does not import fails the run at its start (the root conftest), never a skip."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pytest_run(tmp_path: Path, ci: str) -> subprocess.CompletedProcess:
    """A pytest run of one quick test file with ``megatron`` broken: a package of that name that fails to import,
    first on the path (as a half-removed install leaves it)."""
    broken = tmp_path / "shadow" / "megatron"
    broken.mkdir(parents=True, exist_ok=True)
    (broken / "__init__.py").write_text("raise ImportError('megatron-core is half uninstalled')\n")
    env = {**os.environ, "CI": ci, "PYTHONPATH": f"{broken.parent}{os.pathsep}{ROOT}"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_protocol.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_a_broken_dev_dependency_fails_the_ci_run_and_only_there(tmp_path):
    ci = pytest_run(tmp_path, "true")
    assert ci.returncode == 3, ci.stdout[-2000:]
    assert "CI: megatron.core does not import (ImportError: megatron-core is half uninstalled)" in ci.stdout
    local = pytest_run(tmp_path, "")
    assert local.returncode == 0, local.stdout[-2000:]
