"""Score reproduction: every recipe's ``expected.yaml`` tiers (format: ``core/expected.py``).

Full size (``--benchmark``): the CPU tier's run script runs here (the GRPO demo: ~5 minutes with bf16) and its
metrics must fall inside the tier's bounds. A tier's ``args`` follow the script's own arguments: the GRPO demo
through vLLM runs where vLLM is installed (``.venv-vllm/bin/python -m pytest bench/test_scores.py --benchmark -k
vllm``). A full-scale tier (the published numbers) runs only where its hardware exists and is skipped otherwise,
saying what is missing. Smoke size: the tiers load and validate, nothing runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.expected import check, hardware_missing, load_expected, tier_figures
from core.report import read_metrics

ROOT = Path(__file__).resolve().parents[1]
TIERS = [(p.parent, name) for p in sorted((ROOT / "recipes").glob("*/expected.yaml")) for name in load_expected(p.parent)]


@pytest.mark.parametrize("recipe,tier", [
    pytest.param(r, t, id=f"{r.name}-{t}", marks=pytest.mark.timeout(load_expected(r)[t].get("timeout_s", 600)))
    for r, t in TIERS])
def test_recipe_reproduces_its_expected_scores(recipe, tier, full_size, report, tmp_path):
    spec = load_expected(recipe)[tier]
    if not full_size:
        assert (recipe / spec["run"]).is_file() and spec["bounds"]
        return
    missing = hardware_missing(spec)
    if missing:
        pytest.skip(f"{recipe.name} {tier} tier: {missing}")
    subprocess.run(["bash", str(recipe / spec["run"]), f"trainer.output_dir={tmp_path}", *spec.get("args", [])], cwd=ROOT,
                   env=dict(os.environ, PY=sys.executable), check=True)
    history = read_metrics(tmp_path / "metrics.jsonl")
    figures = tier_figures(history, spec)
    report(f"scores_{recipe.name}_{tier}", **figures)
    assert check(figures, spec, f"recipes/{recipe.name}/expected.yaml {tier}") == []
