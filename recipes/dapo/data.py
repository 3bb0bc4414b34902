"""Data for this recipe -> verl-schema parquet under outputs/data (``hybridrl data prepare dapo`` writes what a config
names; ``python recipes/dapo/data.py --help`` lists the datasets).

  dapo_math  DAPO-Math-17k, the paper's training set (core.data.dapo_math): the HF hub (needs `datasets` and a
             network) or a local .parquet / .jsonl (--src dapo_math=FILE) holding the hub's verl-schema rows or raw
             {problem|prompt, answer} records. The hub copy repeats every problem ~100 times; rows are de-duplicated
             by problem.
  aime24     AIME 2024 (30 problems), the paper's validation set (../shared/data beside the checkout, else the hub).
             Both use DAPO's prompt (TEMPLATE_DAPO: reason, then a last line "Answer: x") and are scored by the
             `Answer:` reward (core.rewards math_dapo: +1 / -1).
  gsm8k      GSM8K with the GRPO recipe's prompt template
  arith_v2   the CPU run's task, core.data.arith: a + b and a * b with a, b in 1..12, the test split held out by
             content (no test problem occurs in training in either operand order)
"""

import sys

from core.data import arith, dapo_math
from core.data.dapo_math import TEMPLATE_DAPO
from core.data.prepare import prepare
from core.data.recipe_data import Dataset, data_cli

TEMPLATE = "{question} Let's think step by step and output the final answer after \"####\"."


DATASETS = {
    "dapo_math": Dataset(dapo_math.write, "DAPO-Math-17k, de-duplicated (the hub, or --src dapo_math=FILE)"),
    "aime24": Dataset(lambda out, src: prepare("aime24", src, out, template=TEMPLATE_DAPO),
                      "AIME 2024 test with DAPO's prompt (../shared/data/aime24, else the hub)"),
    "gsm8k": Dataset(lambda out, src: prepare("gsm8k", src, out, template=TEMPLATE),
                     "GSM8K train/test with the GRPO prompt (../shared/data/gsm8k, else the hub)"),
    "arith_v2": Dataset(lambda out, src: arith.write(out), "a + b and a * b, a, b in 1..12, test held out by content"),
}

if __name__ == "__main__":
    sys.exit(data_cli(DATASETS, __doc__))
