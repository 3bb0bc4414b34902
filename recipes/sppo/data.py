"""Data for this recipe -> verl-schema parquet under outputs/data (``hybridrl data prepare sppo`` writes what a config
names; ``python recipes/sppo/data.py --help`` lists the datasets).

  math          MATH (Hendrycks et al. 2021) train and test, verl's SPPO data: the HF hub (needs `datasets` and a
                network), or --src math=DIR holding math/{train,test}.jsonl records {problem, solution with \\boxed{}}
  minerva_math  Minerva's 272 quantitative-reasoning problems, for evaluation (../shared/data beside the checkout,
                else the hub)
  arith_v2      the CPU run's task, core.data.arith: a + b and a * b with a, b in 1..12, the test split held out by
                content (no test problem occurs in training in either operand order)
"""

import sys

from core.data import arith
from core.data.prepare import prepare
from core.data.recipe_data import Dataset, data_cli

# the answer format the reward reads (its last \boxed{}), as verl's MATH preprocessing asks for
TEMPLATE = "{question} Let's think step by step and output the final answer within \\boxed{{}}."



DATASETS = {
    "math": Dataset(lambda out, src: prepare("math", src, out, template=TEMPLATE),
                    "MATH train/test, answers in \\boxed{} (the hub, or --src math=DIR)"),
    "minerva_math": Dataset(lambda out, src: prepare("minerva_math", src, out, template=TEMPLATE),
                            "Minerva's 272 problems, test (../shared/data/minerva_math, else the hub)"),
    "arith_v2": Dataset(lambda out, src: arith.write(out), "a + b and a * b, a, b in 1..12, test held out by content"),
}

if __name__ == "__main__":
    sys.exit(data_cli(DATASETS, __doc__))
