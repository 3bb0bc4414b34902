"""A recipe's CPU tier run for real (the slow tests): its script into a given output folder, its metrics checked
against the tier's bounds (``core.expected``), the figures printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from core.expected import check, tier_figures
from core.report import read_metrics


def reproduce(recipe: Path, tier: dict, out: Path, where: str, **env: str) -> None:
    """``bash <recipe>/<tier's run> trainer.output_dir=<out>`` (``env``: more environment), then every bound of the
    tier holds on ``<out>/metrics.jsonl`` (an assertion naming the broken ones)."""
    subprocess.run(["bash", str(recipe / tier["run"]), f"trainer.output_dir={out}", *tier.get("args", [])],
                   cwd=recipe.parents[1], env=dict(os.environ, PY=sys.executable, **env), check=True)
    figures = tier_figures(read_metrics(out / "metrics.jsonl"), tier)
    print(json.dumps(figures))
    assert check(figures, tier, where) == []
