"""Data for this recipe -> verl-schema parquet under --out.

  --task gsm8k  GSM8K from ../shared/data/gsm8k (or --src DIR, or --src hub) with the recipe's prompt template.
  --task arith  single-digit arithmetic (a + b, a * b; a, b in 1..9), generated from --seed: the CPU demo's task.
                SmolLM2-135M-Instruct gets ~35% right at temperature 0.7 within 32 tokens (it explains at length
                and is cut off), GSM8K ~0 -- so arith is where a 135M model shows learning in minutes (README).

Usage: python recipes/dapo/data.py [--task gsm8k|arith] [--src DIR|hub] [--out outputs/data]
"""

import argparse
import random
from pathlib import Path

from core.data.prepare import DEFAULT_SRC, prepare, write_parquet

TEMPLATE = "{question} Let's think step by step and output the final answer after \"####\"."
ARITH_TEMPLATE = "What is {a} {op} {b}? Reply with the answer in the form #### <number>."
ARITH_SOURCE = "hybridrl/arith"


def arith_rows(count: int, split: str, seed: int) -> list[dict]:
    rng, rows = random.Random(f"{seed}-{split}"), []
    for i in range(count):
        a, b, op = rng.randint(1, 9), rng.randint(1, 9), rng.choice("+*")
        question = ARITH_TEMPLATE.format(a=a, op=op, b=b)
        rows.append({"data_source": ARITH_SOURCE, "prompt": [{"role": "user", "content": question}],
                     "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a + b if op == "+" else a * b)},
                     "extra_info": {"split": split, "index": i, "question": question}})
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--task", choices=["gsm8k", "arith"], default="gsm8k")
    p.add_argument("--src", default=str(DEFAULT_SRC))
    p.add_argument("--out", default="outputs/data")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.task == "gsm8k":
        prepare("gsm8k", a.src, a.out, template=TEMPLATE)
    else:
        for split, count in (("train", 4000), ("test", 256)):
            path = Path(a.out) / "arith" / f"{split}.parquet"
            write_parquet(arith_rows(count, split, a.seed), path)
            print(f"arith {split}: {count} rows -> {path}")
