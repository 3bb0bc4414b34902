"""GSM8K for this recipe: ../shared/data/gsm8k (or --src DIR, or --src hub) -> verl-schema parquet with the recipe's
prompt template. Usage: python recipes/grpo/data.py [--src DIR|hub] [--out outputs/data]"""

import argparse

from core.data.prepare import DEFAULT_SRC, prepare

TEMPLATE = "{question} Let's think step by step and output the final answer after \"####\"."

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--src", default=str(DEFAULT_SRC))
    p.add_argument("--out", default="outputs/data")
    a = p.parse_args()
    prepare("gsm8k", a.src, a.out, template=TEMPLATE)
