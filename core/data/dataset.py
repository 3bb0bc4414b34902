"""Reading verl-schema parquet (ours or verl's) into rows the trainer and eval use, with named errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

REQUIRED = ("data_source", "prompt", "reward_model")


def validate_row(row: dict, where: str) -> dict:
    """Check one row's schema; raise ValueError naming ``where`` (file and row) and the key."""
    for key in REQUIRED:
        if key not in row or row[key] is None:
            raise ValueError(f"{where}: missing key {key!r}")
    prompt = row["prompt"]
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    if not isinstance(prompt, list) or not prompt or not all(isinstance(m, dict) and "content" in m for m in prompt):
        raise ValueError(f"{where}: key 'prompt' must be a non-empty chat list of {{role, content}} dicts")
    rm = row["reward_model"]
    if not isinstance(rm, dict) or "ground_truth" not in rm:
        raise ValueError(f"{where}: key 'reward_model' needs a 'ground_truth'")
    extra = row.get("extra_info")
    return {"data_source": row["data_source"], "prompt": [dict(m) for m in prompt],
            "ground_truth": rm["ground_truth"], "extra_info": dict(extra) if isinstance(extra, dict) else {},
            "ability": row.get("ability")}


def load_rl_parquet(paths: str | Path | list, limit: int | None = None) -> list[dict[str, Any]]:
    """Rows of one or more verl-schema parquet files: {data_source, prompt, ground_truth, extra_info, ability}."""
    import pandas as pd

    rows = []
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"data file not found: {path}")
        df = pd.read_parquet(path)
        for i, row in enumerate(df.to_dict("records")):
            rows.append(validate_row(row, f"{path}: row {i + 1}"))
            if limit and len(rows) >= limit:
                return rows
    return rows
