"""Data for this recipe -> verl-schema parquet under outputs/data (``hybridrl data prepare distill`` writes what a
config names; ``python recipes/distill/data.py --help`` lists the datasets).

  arith_v2   the CPU tier's task, core.data.arith: a + b and a * b with a, b in 1..12, the test split held out by
             content (no test problem occurs in training in either operand order)
  dapo_math  the full-scale tier's prompts: DAPO-Math-17k (core.data.dapo_math): the HF hub (needs `datasets` and a
             network) or a local .parquet / .jsonl (--src dapo_math=FILE), de-duplicated by problem
  aime24     AIME 2024 (30 problems), the full-scale tier's held-out set (../shared/data beside the checkout, else the
             hub). Both use DAPO's prompt (reason, then a last line "Answer: x"), scored by core's math_dapo reward
"""

import sys

from core.data import arith, dapo_math
from core.data.dapo_math import TEMPLATE_DAPO
from core.data.prepare import prepare
from core.data.recipe_data import Dataset, data_cli

DATASETS = {
    "arith_v2": Dataset(lambda out, src: arith.write(out), "a + b and a * b, a, b in 1..12, test held out by content"),
    "dapo_math": Dataset(dapo_math.write, "DAPO-Math-17k, de-duplicated (the hub, or --src dapo_math=FILE)"),
    "aime24": Dataset(lambda out, src: prepare("aime24", src, out, template=TEMPLATE_DAPO),
                      "AIME 2024 test with DAPO's prompt (../shared/data/aime24, else the hub)"),
}

if __name__ == "__main__":
    sys.exit(data_cli(DATASETS, __doc__))
