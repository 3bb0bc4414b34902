"""Data for this recipe -> verl-schema parquet under --out.

  --task dapo_math  DAPO-Math-17k, the paper's training set: from the HF hub (--src hub, the default; needs
                    `datasets` and a network) or a local .parquet / .jsonl (--src FILE) holding either the hub's
                    verl-schema rows or raw {problem|prompt, answer} records. The hub copy repeats every problem
                    ~100 times; rows are de-duplicated by problem. -> dapo_math/train.parquet
  --task aime24     AIME 2024 (30 problems), the paper's validation set, from ../shared/data/aime24 (or --src DIR,
                    or --src hub). -> aime24/test.parquet
                    Both use DAPO's prompt (TEMPLATE_DAPO: reason, then a last line "Answer: x") and are scored by
                    the `Answer:` reward (core.rewards math_dapo: +1 / -1).
  --task gsm8k  GSM8K from ../shared/data/gsm8k (or --src DIR, or --src hub) with the recipe's prompt template.
  --task arith  the CPU demo's task, core.data.arith: a + b and a * b with a, b in 1..12, the test split held out
                by content (no test problem occurs in training in either operand order) -> arith_v2/

Usage: python recipes/dapo/data.py [--task dapo_math|aime24|gsm8k|arith] [--src DIR|FILE|hub] [--out outputs/data]
"""

import argparse
from pathlib import Path

from core.data import arith
from core.data.prepare import DEFAULT_SRC, prepare, read_jsonl, write_parquet

# DAPO-Math-17k's own prompt wording (the hub rows carry it already; raw records and AIME get it here)
TEMPLATE_DAPO = ("Solve the following math problem step by step. The last line of your response should be of the "
                 "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{question}\n\n"
                 "Remember to put your answer on its own line after \"Answer:\".")
DAPO_HUB = "BytedTsinghua-SIA/DAPO-Math-17k"

TEMPLATE = "{question} Let's think step by step and output the final answer after \"####\"."


def dapo_math_rows(records: list[dict], where: str) -> list[dict]:
    """verl-schema rows (data_source math_dapo), one per distinct problem, from hub rows or raw records. A record
    without a problem or an answer is an error naming ``where`` and its row (1-based)."""
    rows, seen = [], set()
    for i, rec in enumerate(records):
        if isinstance(rec.get("prompt"), (list, tuple)) or hasattr(rec.get("prompt"), "tolist"):
            turns = list(rec["prompt"])
            content = str(turns[-1]["content"]) if turns else ""
            truth = (rec.get("reward_model") or {}).get("ground_truth")
        else:
            question = str(rec.get("problem") or rec.get("prompt") or rec.get("question") or "").strip()
            content = TEMPLATE_DAPO.format(question=question) if question else ""
            truth = rec.get("answer", rec.get("solution"))
        if not content.strip():
            raise ValueError(f"{where}: row {i + 1}: no problem (keys prompt / problem / question)")
        if truth is None or str(truth).strip() == "":
            raise ValueError(f"{where}: row {i + 1}: no answer (reward_model.ground_truth / answer)")
        if content in seen:
            continue
        seen.add(content)
        rows.append({"data_source": "math_dapo", "prompt": [{"role": "user", "content": content}], "ability": "math",
                     "reward_model": {"style": "rule", "ground_truth": str(truth).strip()},
                     "extra_info": {"split": "train", "index": len(rows), "source_row": i}})
    return rows


def read_dapo_math(src: str) -> tuple[list[dict], str]:
    if src == "hub":
        try:
            import datasets
        except ImportError:
            raise RuntimeError("--src hub needs `datasets` (pip install -e '.[hub]') and a network; or pass "
                               "--src FILE (a .parquet / .jsonl of DAPO-Math-17k)") from None
        return [dict(r) for r in datasets.load_dataset(DAPO_HUB, split="train")], f"hub:{DAPO_HUB}"
    path = Path(src)
    if path.suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict("records"), str(path)
    if path.suffix == ".jsonl":
        return read_jsonl(path), str(path)
    raise ValueError(f"--src {src}: expected 'hub', a .parquet or a .jsonl file")


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
