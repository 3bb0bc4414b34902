"""Data for this recipe -> verl-schema parquet under outputs/data (``hybridrl data prepare agent`` writes what a
config names; ``python recipes/agent/data.py --help`` lists the datasets).

  agent_mult  the CPU tier: multiplication of two- and three-digit numbers (a, b in 11..999), which SmolLM2-135M
              cannot do in its head, with a calculator tool. Each prompt is a one-shot conversation (system prompt
              naming the tool, one worked question with its tool call and answer) and then the question. The test
              split is held out by content: an unordered pair {a, b} is a test problem when the sha256 of "min*max"
              starts with "0" (1/16 of all pairs, the same on every machine); training rows are drawn only from the
              other pairs
  retool      the full-scale data, as verl's recipe/retool writes it (ReTool, arXiv:2504.11536): DAPO-Math-17k for
              training (the hub, or --src retool=FILE) and AIME 2024 for validation (../shared/data beside the
              checkout, else the hub), each prompt with a system message listing the code_interpreter tool and the
              \\boxed answer format -> retool/{train,aime24}.parquet
"""

from __future__ import annotations

import sys
from pathlib import Path

from core.data.agent_mult import (EXAMPLE, FOLDER, HIGH, LOW, ONE_SHOT, QUESTION, SOURCE, SYSTEM,  # noqa: F401
                                   held_out, pairs, row, write_mult)
from core.data.dapo_math import dapo_math_rows, read_dapo_math
from core.data.retool import retool_prompt
from core.data.prepare import make_rows, read_records, write_parquet
from core.data.recipe_data import Dataset, data_cli

def write_retool(dapo_src: str, aime_src: str | Path, out: str | Path) -> dict[str, Path]:
    """``<out>/retool/train.parquet`` (DAPO-Math-17k, one row per distinct problem) and ``aime24.parquet``."""
    records, where = read_dapo_math(dapo_src)
    paths = {"train": Path(out) / "retool" / "train.parquet", "aime24": Path(out) / "retool" / "aime24.parquet"}
    write_parquet(retool_prompt(dapo_math_rows(records, where)), paths["train"])
    aime_records, aime_where = read_records("aime24", "test", aime_src)
    write_parquet(retool_prompt(make_rows("aime24", "test", aime_records, aime_where)[0]), paths["aime24"])
    print(f"retool: {paths['train']} ({where}), {paths['aime24']} ({aime_where})")
    return paths


DATASETS = {
    "agent_mult": Dataset(lambda out, src: write_mult(out), "a x b, a, b in 11..999, with a calculator tool; test held "
                                                           "out by content"),
    "retool": Dataset(lambda out, src: write_retool(src or "hub", None, out),
                      "DAPO-Math-17k (the hub, or --src retool=FILE) + AIME 2024, ReTool's prompt"),
}

if __name__ == "__main__":
    sys.exit(data_cli(DATASETS, __doc__))
