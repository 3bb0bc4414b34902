"""Data for this recipe -> verl-schema parquet under --out.

  --task dapo_math  DAPO-Math-17k, the paper's training set (core.data.dapo_math): from the HF hub (--src hub, the
                    default; needs `datasets` and a network) or a local .parquet / .jsonl (--src FILE); rows
                    de-duplicated by problem. -> dapo_math/train.parquet
  --task aime24     AIME 2024 (30 problems), the paper's validation set, from ../shared/data/aime24 (or --src DIR,
                    or --src hub), with DAPO's prompt. -> aime24/test.parquet
  --task gsm8k      GSM8K from ../shared/data/gsm8k (or --src DIR, or --src hub).
  --task arith      the CPU run's task, core.data.arith: a + b and a * b with a, b in 1..12, the test split held out by
                    content (no test problem occurs in training in either operand order) -> arith_v2/

Usage: python recipes/vapo/data.py [--task dapo_math|aime24|gsm8k|arith] [--src DIR|FILE|hub] [--out outputs/data]
"""

import argparse
from pathlib import Path

from core.data import arith
from core.data.dapo_math import TEMPLATE_DAPO, dapo_math_rows, read_dapo_math
from core.data.prepare import DEFAULT_SRC, prepare, write_parquet

TEMPLATE = "{question} Let's think step by step and output the final answer after \"####\"."


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--task", choices=["dapo_math", "aime24", "gsm8k", "arith"], default="dapo_math")
    p.add_argument("--src", default=None, help="hub (dapo_math's default), a folder (../shared/data) or a file")
    p.add_argument("--out", default="outputs/data")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.task == "dapo_math":
        records, where = read_dapo_math(a.src or "hub")
        rows = dapo_math_rows(records, where)
        write_parquet(rows, Path(a.out) / "dapo_math" / "train.parquet")
        print(f"dapo_math train: {len(rows)} distinct problems of {len(records)} rows ({where}) -> "
              f"{Path(a.out) / 'dapo_math' / 'train.parquet'}")
    elif a.task == "aime24":
        prepare("aime24", a.src or str(DEFAULT_SRC), a.out, template=TEMPLATE_DAPO)
    elif a.task == "gsm8k":
        prepare("gsm8k", a.src or str(DEFAULT_SRC), a.out, template=TEMPLATE)
    else:
        arith.write(a.out, seed=a.seed)
