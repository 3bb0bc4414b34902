"""DAPO-Math-17k (Yu et al. 2025), the training set of the DAPO and VAPO papers, as verl-schema rows: read from the
HF hub or a local .parquet / .jsonl, one row per distinct problem, with DAPO's own prompt wording (reason, then a
last line "Answer: x"), scored by the ``math_dapo`` reward (+1 / -1)."""

from __future__ import annotations

from pathlib import Path

from core.data.prepare import read_table, write_parquet

# DAPO-Math-17k's own prompt wording (the hub rows carry it already; raw records and AIME get it here)
TEMPLATE_DAPO = ("Solve the following math problem step by step. The last line of your response should be of the "
                 "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{question}\n\n"
                 "Remember to put your answer on its own line after \"Answer:\".")
DAPO_HUB = "BytedTsinghua-SIA/DAPO-Math-17k"


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
    """DAPO-Math-17k's rows from the hub (``src`` 'hub') or a local .parquet / .jsonl."""
    return read_table(src, DAPO_HUB)


def write(out: str | Path, src: str | None = None) -> Path:
    """``<out>/dapo_math/train.parquet``: DAPO-Math-17k from ``src`` (the hub when None, or a .parquet / .jsonl), one
    row per distinct problem (the DAPO and VAPO recipes' ``dapo_math`` dataset)."""
    records, where = read_dapo_math(src or "hub")
    rows = dapo_math_rows(records, where)
    path = Path(out) / "dapo_math" / "train.parquet"
    write_parquet(rows, path)
    print(f"dapo_math train: {len(rows)} distinct problems of {len(records)} rows ({where}) -> {path}")
    return path
