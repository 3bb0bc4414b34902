"""Data for this recipe -> verl-schema parquet under --out.

  --task math          MATH (Hendrycks et al. 2021) train and test, verl's SPPO data: from the HF hub (--src hub, the
                       default; needs `datasets` and a network) or --src DIR holding math/{train,test}.jsonl records
                       {problem, solution with \\boxed{}}. -> math/{train,test}.parquet
  --task minerva_math  Minerva's 272 quantitative-reasoning problems, for evaluation, from ../shared/data/minerva_math
                       (or --src DIR, or --src hub). -> minerva_math/test.parquet
  --task arith         the CPU run's task, core.data.arith: a + b and a * b with a, b in 1..12, the test split held out
                       by content (no test problem occurs in training in either operand order) -> arith_v2/

Usage: python recipes/sppo/data.py [--task math|minerva_math|arith] [--src DIR|hub] [--out outputs/data]
"""

import argparse

from core.data import arith
from core.data.prepare import DEFAULT_SRC, prepare

# the answer format the reward reads (its last \boxed{}), as verl's MATH preprocessing asks for
TEMPLATE = "{question} Let's think step by step and output the final answer within \\boxed{{}}."


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--task", choices=["math", "minerva_math", "arith"], default="math")
    p.add_argument("--src", default=None, help="hub (math's default) or a folder (../shared/data)")
    p.add_argument("--out", default="outputs/data")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.task == "math":
        prepare("math", a.src or "hub", a.out, template=TEMPLATE)
    elif a.task == "minerva_math":
        prepare("minerva_math", a.src or str(DEFAULT_SRC), a.out, template=TEMPLATE)
    else:
        arith.write(a.out, seed=a.seed)
