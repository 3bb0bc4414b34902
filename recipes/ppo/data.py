"""Data for this recipe -> verl-schema parquet under --out.

  --task gsm8k  GSM8K from ../shared/data/gsm8k (or --src DIR, or --src hub) with the recipe's prompt template.
  --task math   MATH (--src hub, or --src DIR holding math/{train,test}.jsonl) with verl's math_dataset.py
                instruction (the four-model run, qwen2_7b_rm.yaml)
  --task arith  the CPU demo's task, core.data.arith: a + b and a * b with a, b in 1..12, the test split held out
                by content (no test problem occurs in training in either operand order) -> arith_v2/

Usage: python recipes/ppo/data.py [--task gsm8k|math|arith] [--src DIR|hub] [--out outputs/data]
"""

import argparse

from core.data import arith
from core.data.prepare import DEFAULT_SRC, prepare

TEMPLATE = "{question} Let's think step by step and output the final answer after \"####\"."
MATH_TEMPLATE = "{question} Let's think step by step and output the final answer within \\boxed{{}}."


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--task", choices=["gsm8k", "math", "arith"], default="gsm8k")
    p.add_argument("--src", default=str(DEFAULT_SRC))
    p.add_argument("--out", default="outputs/data")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.task in ("gsm8k", "math"):
        prepare(a.task, a.src, a.out, template=TEMPLATE if a.task == "gsm8k" else MATH_TEMPLATE)
    else:
        arith.write(a.out, seed=a.seed)
