"""Data for this recipe -> verl-schema parquet under outputs/data (``hybridrl data prepare prime`` writes what a
config names; ``python recipes/prime/data.py --help`` lists the datasets).

  eurus_math  Eurus-2-RL-Data (PRIME-RL/Eurus-2-RL-Data), the PRIME paper's RL set: the HF hub (needs `datasets` and a
              network) or a local .parquet / .jsonl of its rows (--src eurus_math=FILE). Its math rows only (ability
              "math"; its coding rows need a code sandbox this recipe does not have), prompts as they are (the Eurus
              system prompt, answers in \\boxed{}).
  aime24, amc23, minerva_math
              the paper's math evaluation sets (../shared/data beside the checkout, else the hub), asked for a
              \\boxed{} answer
  gsm8k       GSM8K with the GRPO recipe's prompt template
  arith_v2    the CPU run's task, core.data.arith: a + b and a * b with a, b in 1..12, the test split held out by
              content (no test problem occurs in training in either operand order)
"""

import sys
from pathlib import Path

from core.data import arith
from core.data.prepare import prepare, read_table, write_parquet
from core.data.recipe_data import Dataset, data_cli

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




def write_eurus(out: Path, src: str | None) -> None:
    records, where = read_table(src or "hub", EURUS_HUB)
    rows = eurus_math_rows(records, where)
    write_parquet(rows, Path(out) / "eurus_math" / "train.parquet")
    print(f"eurus math train: {len(rows)} of {len(records)} rows ({where}) -> {Path(out) / 'eurus_math'}")


def boxed(name: str) -> Dataset:
    return Dataset(lambda out, src: prepare(name, src, out, template=TEMPLATE_BOXED),
                   f"{name} test, asked for a \\boxed{{}} answer (../shared/data/{name}, else the hub)")


DATASETS = {
    "eurus_math": Dataset(write_eurus, "Eurus-2-RL-Data's math rows (the hub, or --src eurus_math=FILE)"),
    **{name: boxed(name) for name in ("aime24", "amc23", "minerva_math")},
    "gsm8k": Dataset(lambda out, src: prepare("gsm8k", src, out, template=TEMPLATE),
                     "GSM8K train/test with the recipe's prompt (../shared/data/gsm8k, else the hub)"),
    "arith_v2": Dataset(lambda out, src: arith.write(out), "a + b and a * b, a, b in 1..12, test held out by content"),
}

if __name__ == "__main__":
    sys.exit(data_cli(DATASETS, __doc__))
