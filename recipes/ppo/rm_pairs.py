"""Preference pairs for the reward-model CPU tier: the policy's own answers to the arithmetic task, labelled by the
rule, so the truth behind every preference is known.

The RLHF pipeline in miniature. The starting policy (SmolLM2-135M-Instruct) answers each problem of a split
``--samples`` times at temperature 0.7 (``core.rollout.engine.RolloutEngine``); the rule (last number = answer)
labels each answer. Two kinds of pair per problem, chosen first:
  * natural: a right answer against a wrong one of the same problem (up to ``--per-problem``);
  * edited: an answer against itself with its last number changed -- right (the true result) against wrong (the
    result off by 1..3, or the operands' other operation). These differ in the number alone, so a model can rank
    them only by doing the arithmetic, not by the style of the answer.

The train pairs come from ``core.data.arith``'s training problems, the held-out pairs from its test problems (held
out by content: no test problem is in training in either operand order) -- the same split the PPO run trains and
validates on. Output: TRL/verl's preference schema (``prompt`` as a chat, ``chosen``, ``rejected``), one pair per
line, for ``python -m core.rm_train``.

    python recipes/ppo/rm_pairs.py --out outputs/data/arith_rm   -> train.jsonl, test.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

import torch

from core.config.algo import SamplingParams
from core.data import arith
from core.rollout.engine import RolloutEngine
from core.rollout.batch import decode_responses
from core.models import default_dtype, load_causal_lm, load_tokenizer
from core.rewards import default_compute_score

LAST_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def with_last_number(text: str, value: int) -> str | None:
    """``text`` with its last number replaced by ``value``; None when it has no number."""
    found = list(LAST_NUMBER.finditer(text))
    if not found:
        return None
    last = found[-1]
    return text[:last.start()] + str(value) + text[last.end():]


def is_right(problem: tuple[int, str, int], text: str) -> bool:
    """The rule's verdict on an answer to ``problem``: its last number is the result."""
    return default_compute_score(arith.SOURCE, text, str(arith.answer(*problem)))["score"] > 0


def wrong_result(a: int, op: str, b: int, rng: random.Random) -> int:
    """A plausible wrong result: off by 1..3, or the other operation's result when that differs."""
    right, other = arith.answer(a, op, b), arith.answer(a, "*" if op == "+" else "+", b)
    choices = [right + d for d in (-3, -2, -1, 1, 2, 3) if right + d >= 0] + ([other] * 2 if other != right else [])
    return rng.choice(choices)


def pairs_of_problem(problem: tuple[int, str, int], answers: list[str], per_problem: int,
                     rng: random.Random) -> list[dict]:
    """The natural and edited pairs of one problem from its sampled ``answers`` (texts)."""
    a, op, b = problem
    prompt = arith.row(a, op, b, "", 0)["prompt"]
    right = [t for t in answers if is_right(problem, t)]
    wrong = [t for t in answers if t not in right]
    natural = [(c, r) for c in right for r in wrong]
    rng.shuffle(natural)
    edited = []
    for text in answers[:per_problem]:
        good, bad = with_last_number(text, arith.answer(a, op, b)), with_last_number(text, wrong_result(a, op, b, rng))
        if good is not None and bad is not None and good != bad:
            edited.append((good, bad))
    return [{"prompt": prompt, "chosen": c, "rejected": r, "kind": kind}
            for kind, chosen in (("natural", natural[:per_problem]), ("edited", edited)) for c, r in chosen]


def sample_answers(engine: RolloutEngine, tokenizer, problems: list[tuple[int, str, int]], samples: int,
                   seed: int) -> list[list[str]]:
    """``samples`` answers per problem at temperature 0.7 within 32 tokens (the PPO demo's sampling)."""
    prompts = [tokenizer.apply_chat_template(arith.row(a, op, b, "", 0)["prompt"], add_generation_prompt=True,
                                             tokenize=True, return_dict=False) for a, op, b in problems]
    params = SamplingParams(n=samples, temperature=0.7, max_new_tokens=32, seed=seed)
    texts = decode_responses(tokenizer, engine.generate(prompts, params))
    return [texts[i * samples:(i + 1) * samples] for i in range(len(problems))]


def write(model: str, out: str | Path, samples: int = 8, per_problem: int = 4, seed: int = 0) -> dict[str, dict]:
    """``<out>/train.jsonl`` and ``<out>/test.jsonl``; returns per split the pair counts and the policy's accuracy."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(model)
    engine = RolloutEngine(load_causal_lm(model, default_dtype()), tokenizer)
    summary = {}
    for i, split in enumerate(("train", "test")):
        rng = random.Random(f"rm-pairs-{split}-{seed}")
        problems = arith.problems(split)
        with torch.no_grad():
            answers = sample_answers(engine, tokenizer, problems, samples, seed + i)
        rows = [p for prob, ans in zip(problems, answers) for p in pairs_of_problem(prob, ans, per_problem, rng)]
        with open(out / f"{split}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        right = sum(is_right(p, t) for p, ans in zip(problems, answers) for t in ans)
        summary[split] = {"problems": len(problems), "pairs": len(rows),
                          "natural": sum(r["kind"] == "natural" for r in rows),
                          "policy_accuracy": right / (len(problems) * samples)}
        print(f"{split}: {summary[split]} -> {out / f'{split}.jsonl'}")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="SmolLM2-135M-Instruct")
    p.add_argument("--out", default="outputs/data/arith_rm")
    p.add_argument("--samples", type=int, default=8, help="answers sampled per problem")
    p.add_argument("--per-problem", type=int, default=4, help="at most this many pairs of each kind per problem")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    write(a.model, a.out, a.samples, a.per_problem, a.seed)
