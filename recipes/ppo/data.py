"""Data for this recipe -> verl-schema parquet under outputs/data (``hybridrl data prepare ppo`` writes what a config
names; ``python recipes/ppo/data.py --help`` lists the datasets).

  gsm8k     GSM8K with the recipe's prompt template: ../shared/data/gsm8k beside the checkout when there, else the hub
  math      MATH with verl's math_dataset.py instruction (the four-model run, qwen2_7b_rm.yaml): the hub, or --src DIR
            holding math/{train,test}.jsonl
  arith_v2  the CPU demo's task, core.data.arith: a + b and a * b with a, b in 1..12, the test split held out by
            content (no test problem occurs in training in either operand order)
"""

import sys

from core.data import arith
from core.data.prepare import prepare
from core.data.recipe_data import Dataset, data_cli

TEMPLATE = "{question} Let's think step by step and output the final answer after \"####\"."
MATH_TEMPLATE = "{question} Let's think step by step and output the final answer within \\boxed{{}}."

DATASETS = {
    "gsm8k": Dataset(lambda out, src: prepare("gsm8k", src, out, template=TEMPLATE),
                     "GSM8K train/test with the recipe's prompt (../shared/data/gsm8k, else the hub)"),
    "math": Dataset(lambda out, src: prepare("math", src, out, template=MATH_TEMPLATE),
                    "MATH train/test, answers in \\boxed{} (the hub, or --src math=DIR)"),
    "arith_v2": Dataset(lambda out, src: arith.write(out), "a + b and a * b, a, b in 1..12, test held out by content"),
}

if __name__ == "__main__":
    sys.exit(data_cli(DATASETS, __doc__))
