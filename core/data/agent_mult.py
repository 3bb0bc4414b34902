"""The agent recipes' CPU task (the agent recipe's RL tier, the SFT recipe's cold start): multiplication of two- and
three-digit numbers (a, b in 11..999), which SmolLM2-135M cannot do in its head, with a calculator tool.

Each prompt is a one-shot conversation (a system prompt naming the tool, one worked question with its tool call and
answer) and then the question. The test split is held out by content: an unordered pair {a, b} is a test problem
when the sha256 of "min*max" starts with "0" (1/16 of all pairs, the same on every machine); training rows and
traces are drawn only from the other pairs. ``solution(a, b)``: a correct tool-using answer, in the one-shot's form.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

from core.data.prepare import write_parquet

SOURCE = "hybridrl/agent_mult"
FOLDER = "agent_mult"
LOW, HIGH = 11, 999
TEST_COUNT = 64  # the held-out problems write_mult writes
QUESTION = "What is {a} * {b}?"
# The example conversation every CPU prompt starts with: SmolLM2-135M-Instruct calls no tool from a JSON-schema
# system prompt alone (0 of 16 samples at step 0), but follows this example in ~60% of samples (README).
EXAMPLE = (12, 34)
SYSTEM = ('You have a calculator. To use it, write <tool_call>{"name": "calculator", "arguments": {"expression": '
          '"..."}}</tool_call> and wait for the result.')


def solution(a: int, b: int) -> list[dict]:
    """The turns that answer "What is a * b?" with the calculator, as the one-shot example does: the call, the
    tool's answer, the answer."""
    return [{"role": "assistant", "content": '<tool_call>{"name": "calculator", "arguments": {"expression": '
                                             f'"{a} * {b}"}}}}</tool_call>'},
            {"role": "tool", "content": str(a * b)},
            {"role": "assistant", "content": f"The answer is {a * b}."}]


ONE_SHOT = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": QUESTION.format(a=EXAMPLE[0], b=EXAMPLE[1])}] + solution(*EXAMPLE)


def held_out(a: int, b: int) -> bool:
    """Is {a, b} (either order) a test problem? sha256 of 'min*max' starting with '0': 1/16 of pairs."""
    return hashlib.sha256(f"{min(a, b)}*{max(a, b)}".encode()).hexdigest().startswith("0")


def row(a: int, b: int, split: str, index: int) -> dict:
    """One verl-schema row: the one-shot conversation, then the question."""
    question = QUESTION.format(a=a, b=b)
    return {"data_source": SOURCE, "prompt": ONE_SHOT + [{"role": "user", "content": question}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a * b)},
            "extra_info": {"split": split, "index": index, "question": question}}


def pairs(split: str, count: int, seed: int = 0) -> list[tuple[int, int]]:
    """``count`` (a, b) of ``split``: 'test' distinct problems, 'train' drawn with repeats allowed (there are ~460k
    training pairs: repeats are rare). Neither contains the example's pair."""
    if split not in ("train", "test"):
        raise ValueError(f"agent_mult split must be 'train' or 'test', got {split!r}")
    rng, out, seen = random.Random(f"agent-mult-{split}-{seed}"), [], set()
    while len(out) < count:
        a, b = rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)
        key = (min(a, b), max(a, b))
        if held_out(a, b) != (split == "test") or key == tuple(sorted(EXAMPLE)) or (split == "test" and key in seen):
            continue
        seen.add(key)
        out.append((a, b))
    return out


def write_mult(out: str | Path, train_count: int = 2000, test_count: int = TEST_COUNT, seed: int = 0) -> dict[str, Path]:
    paths = {}
    for split, count in (("train", train_count), ("test", test_count)):
        paths[split] = Path(out) / FOLDER / f"{split}.parquet"
        write_parquet([row(a, b, split, i) for i, (a, b) in enumerate(pairs(split, count, seed))], paths[split])
        print(f"agent_mult {split}: {count} rows -> {paths[split]}")
    return paths


def operands(question: str) -> tuple[int, int]:
    """(a, b) of a question "What is a * b?"; ValueError otherwise."""
    head, _, tail = question.removeprefix("What is ").removesuffix("?").partition(" * ")
    if not (head.isdigit() and tail.isdigit()):
        raise ValueError(f"not an agent_mult question: {question!r}")
    return int(head), int(tail)
