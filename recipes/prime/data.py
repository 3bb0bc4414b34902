"""Data for this recipe -> verl-schema parquet under --out.

  --task eurus  Eurus-2-RL-Data (PRIME-RL/Eurus-2-RL-Data), the PRIME paper's RL set: from the HF hub (--src hub, the
                default; needs `datasets` and a network) or a local .parquet / .jsonl of its rows (--src FILE). Its math
                rows only (ability "math"; its coding rows need a code sandbox this recipe does not have), prompts as
                they are (the Eurus system prompt, answers in \\boxed{}). -> eurus_math/train.parquet
  --task aime24 | amc23 | minerva_math
                the paper's math evaluation sets from ../shared/data (or --src DIR, or --src hub), asked for a \\boxed{}
                answer -> <task>/test.parquet
  --task gsm8k  GSM8K from ../shared/data/gsm8k (or --src DIR, or --src hub) with the GRPO recipe's prompt template.
  --task arith  the CPU run's task, core.data.arith: a + b and a * b with a, b in 1..12, the test split held out
                by content (no test problem occurs in training in either operand order) -> arith_v2/

Usage: python recipes/prime/data.py [--task eurus|aime24|amc23|minerva_math|gsm8k|arith] [--src DIR|FILE|hub]
       [--out outputs/data]
"""

import argparse
from pathlib import Path

from core.data import arith
from core.data.prepare import DEFAULT_SRC, prepare, read_table, write_parquet

TEMPLATE = "{question} Let's think step by step and output the final answer after \"####\"."
TEMPLATE_BOXED = "{question}\n\nPresent the answer in LaTex format: \\boxed{{Your answer}}"
EURUS_HUB = "PRIME-RL/Eurus-2-RL-Data"


def eurus_math_rows(records: list[dict], where: str) -> list[dict]:
    """The math rows of Eurus-2-RL-Data in verl's schema (prompt messages and data_source kept). A math row without
    a prompt or a ground truth is an error naming ``where`` and its row (1-based)."""
    rows = []
    for i, rec in enumerate(records):
        if str(rec.get("ability", "")).lower() != "math":
            continue
        prompt = [dict(m) for m in (rec.get("prompt") if rec.get("prompt") is not None else [])]
        truth = (rec.get("reward_model") or {}).get("ground_truth")
        if not prompt or not str(prompt[-1].get("content", "")).strip():
            raise ValueError(f"{where}: row {i + 1}: no prompt messages")
        if truth is None or str(truth).strip() == "":
            raise ValueError(f"{where}: row {i + 1}: no reward_model.ground_truth")
        rows.append({"data_source": str(rec.get("data_source") or "math"), "prompt": prompt, "ability": "math",
                     "reward_model": {"style": "rule", "ground_truth": str(truth).strip()},
                     "extra_info": {"split": "train", "index": len(rows), "source_row": i}})
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--task", choices=["eurus", "aime24", "amc23", "minerva_math", "gsm8k", "arith"], default="eurus")
    p.add_argument("--src", default=None, help="hub (eurus' default), a folder (../shared/data) or a file")
    p.add_argument("--out", default="outputs/data")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.task == "eurus":
        records, where = read_table(a.src or "hub", EURUS_HUB)
        rows = eurus_math_rows(records, where)
        write_parquet(rows, Path(a.out) / "eurus_math" / "train.parquet")
        print(f"eurus math train: {len(rows)} of {len(records)} rows ({where}) -> {Path(a.out) / 'eurus_math'}")
    elif a.task in ("aime24", "amc23", "minerva_math"):
        prepare(a.task, a.src or str(DEFAULT_SRC), a.out, template=TEMPLATE_BOXED)
    elif a.task == "gsm8k":
        prepare("gsm8k", a.src or str(DEFAULT_SRC), a.out, template=TEMPLATE)
    else:
        arith.write(a.out, seed=a.seed)
