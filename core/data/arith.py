"""The CPU demo's task (GRPO, PPO and DAPO recipes, the score tiers): integer arithmetic with a test split that is
held out by content.

Problems: ``a + b`` and ``a * b`` with a, b in 1..12 -- 288 questions, 156 when ``a op b`` and ``b op a`` count
as one problem. A fixed third of each operator's unordered problems (26 of 78, chosen by a sha256 of ``op, min,
max``: the same on every machine) is the test split: 91 questions, each once, in a fixed order. No test problem
occurs in the training split in either operand order; the training split draws its rows (with repeats) from the
other 197 questions.

Why this task: SmolLM2-135M-Instruct answers ~60% greedily and ~32% at temperature 0.7 within 32 tokens (it
explains at length and is cut off), so GRPO groups start with varied rewards and the model visibly learns in a
few minutes on 2 CPU cores. The reward (``core.rewards``, data_source ``hybridrl/arith``) is 1 when the last
number of the response is the answer, else 0.

    python -m core.data.arith --out outputs/data     -> outputs/data/arith_v2/{train,test}.parquet
"""

from __future__ import annotations

import argparse
import hashlib
import random
from pathlib import Path

from core.data.prepare import write_parquet

SOURCE = "hybridrl/arith"
TEMPLATE = "What is {a} {op} {b}? Reply with the answer in the form #### <number>."
OPERANDS = range(1, 13)
OPS = "+*"
# the folder under --out: v2 is the held-out-by-content version (v1, ``arith/``, drew both splits from the same
# 162 single-digit problems, so its "held-out" score was a training-set score)
FOLDER = "arith_v2"


def answer(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a * b


def _key(a: int, op: str, b: int) -> str:
    return f"{op}:{min(a, b)}:{max(a, b)}"


def _test_keys() -> frozenset[str]:
    """For each operator, the third of its unordered problems whose keys hash lowest (sha256: the same everywhere)."""
    chosen = []
    for op in OPS:
        keys = sorted({_key(a, op, b) for a in OPERANDS for b in OPERANDS},
                      key=lambda k: hashlib.sha256(k.encode()).hexdigest())
        chosen += keys[: len(keys) // 3]
    return frozenset(chosen)


TEST_KEYS = _test_keys()


def held_out(a: int, op: str, b: int) -> bool:
    """Is the problem ``a op b`` (in either operand order) in the test split?"""
    return _key(a, op, b) in TEST_KEYS


def problems(split: str) -> list[tuple[int, str, int]]:
    """Every (a, op, b) of ``split`` ('train' or 'test'), in a fixed order."""
    if split not in ("train", "test"):
        raise ValueError(f"arith split must be 'train' or 'test', got {split!r}")
    return [(a, op, b) for op in OPS for a in OPERANDS for b in OPERANDS if held_out(a, op, b) == (split == "test")]


def row(a: int, op: str, b: int, split: str, index: int) -> dict:
    """One verl-schema row."""
    question = TEMPLATE.format(a=a, op=op, b=b)
    return {"data_source": SOURCE, "prompt": [{"role": "user", "content": question}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(answer(a, op, b))},
            "extra_info": {"split": split, "index": index, "question": question}}


def rows(split: str, count: int = 4000, seed: int = 0) -> list[dict]:
    """'test': each held-out problem once (``count`` is ignored); 'train': ``count`` rows drawn with repeats from the
    training problems by a generator seeded with ``seed``."""
    pool = problems(split)
    if split == "test":
        return [row(a, op, b, split, i) for i, (a, op, b) in enumerate(pool)]
    rng = random.Random(f"arith-{seed}")
    return [row(*rng.choice(pool), split, i) for i in range(count)]


def write(out: str | Path, train_count: int = 4000, seed: int = 0) -> dict[str, Path]:
    """``<out>/arith_v2/train.parquet`` and ``test.parquet``; returns their paths by split."""
    paths = {}
    for split in ("train", "test"):
        paths[split] = Path(out) / FOLDER / f"{split}.parquet"
        data = rows(split, train_count, seed)
        write_parquet(data, paths[split])
        print(f"arith {split}: {len(data)} rows ({len(problems(split))} distinct problems) -> {paths[split]}")
    return paths


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="outputs/data")
    p.add_argument("--train-count", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    write(a.out, a.train_count, a.seed)
