"""Verifiable rewards, keyed by ``data_source``, with verl's signature so verl reward files work unchanged:

    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict   (dict: has "score")

``default_compute_score`` dispatches on ``data_source`` through ``REWARDS``; ``load_reward_fn(path, name)`` loads a
user's function from a file; ``score_batch`` scores many responses in parallel with a per-call timeout.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from core.rewards import code_tests, gsm8k, math_answer as math_reward
from core.rewards.scoring import RewardError, RewardFn, ScoredBatch, sample_names, score_batch


class _Registry:
    def __init__(self):
        self._fns: dict[str, RewardFn] = {}

    def register(self, *sources: str):
        def add(fn):
            for s in sources:
                self._fns[s] = fn
            return fn

        return add

    def __getitem__(self, source: str) -> RewardFn:
        if source in self._fns:
            return self._fns[source]
        raise KeyError(f"no reward registered for data_source {source!r}; known: {sorted(self._fns)}. "
                       f"Pass a custom reward (reward.path / reward.name) or register one.")

    def names(self) -> list[str]:
        return sorted(self._fns)


REWARDS = _Registry()


def _result(score: float, pred: str | None) -> dict:
    return {"score": score, "acc": score >= 1.0, "pred": pred if pred is not None else ""}


@REWARDS.register("openai/gsm8k", "gsm8k")
def gsm8k_strict(data_source, solution_str, ground_truth, extra_info=None):
    """GSM8K, strict ``#### n`` format (verl's default for openai/gsm8k).
    Example: '... #### 72' vs '72' -> {'score': 1.0, 'acc': True, 'pred': '72'}."""
    score = gsm8k.compute_score(solution_str, ground_truth, method="strict")
    return _result(score, gsm8k.extract_answer(solution_str, "strict"))


@REWARDS.register("gsm8k_format")
def gsm8k_format(data_source, solution_str, ground_truth, extra_info=None):
    """GSM8K, strict ``#### n`` with a format term: 1.0 for the right number, 0.1 for ``#### n`` with a wrong one, 0
    without ``####`` (a small model near 0 on strict GSM8K still gets groups whose rewards vary). ``acc`` is the
    strict correctness. Examples vs '72': '#### 72' -> 1.0; '#### 70' -> 0.1; 'it is 72' -> 0.0."""
    score = gsm8k.compute_score(solution_str, ground_truth, method="strict", format_score=0.1)
    return _result(score, gsm8k.extract_answer(solution_str, "strict"))


@REWARDS.register("gsm8k_flexible")
def gsm8k_flexible(data_source, solution_str, ground_truth, extra_info=None):
    """GSM8K, the last number in the response. Example: 'so 3 + 4 = 7' vs '7' -> score 1.0."""
    score = gsm8k.compute_score(solution_str, ground_truth, method="flexible")
    return _result(score, gsm8k.extract_answer(solution_str, "flexible"))


@REWARDS.register("hybridrl/arith")
def arith_last_number(data_source, solution_str, ground_truth, extra_info=None):
    """The CPU demo's arithmetic (``core.data.arith``): 1.0 when the last number of the response is the answer, else
    0 -- an answer cut off by the length limit, or followed by other numbers, scores 0.
    Examples vs '12': '3 * 4 = 12' -> 1.0; '#### 12' -> 1.0; '12, or maybe 13' -> 0.0; 'To find 3 * 4 we' -> 0.0."""
    score = gsm8k.compute_score(solution_str, ground_truth, method="flexible", format_score=0.0)
    return _result(score, gsm8k.extract_answer(solution_str, "flexible"))


@REWARDS.register("hybridrl/agent_mult")
def agent_mult_after_last_call(data_source, solution_str, ground_truth, extra_info=None):
    """The agent recipes' CPU task (``core.data.agent_mult``): 1.0 when the last number of the model's text after its
    last tool call is the product, else 0.0 (a last number ending a list or an alternative, '3 or 4', is none).
    Numbers inside a tool call do not count: an unanswered call scores 0. Examples vs '56088':
    '<tool_call>...</tool_call>The answer is 56088.' -> 1.0; '123 * 456 = 56088' -> 1.0 (no tool, still right);
    '<tool_call>{... "123 * 456"}</tool_call>' -> 0.0 (no answer after the call)."""
    after = solution_str.rsplit("</tool_call>", 1)[-1] if "</tool_call>" in solution_str else solution_str
    pred = gsm8k.extract_answer(after, "flexible")  # the last number; '3 or 4': none
    acc = pred is not None and gsm8k.compute_score(pred, str(ground_truth), method="flexible") == 1.0
    return {"score": float(acc), "acc": acc, "pred": pred or ""}


# verl sends "math" and "aime*" to its math_dapo rule (+1 / -1, the Answer: line first); here they are
# evaluation sets scored 0 / 1 by the boxed answer, so their mean reads as an accuracy. A recipe that trains on
# them with verl's rule maps them to "math_dapo" (recipes/dapo, recipes/vapo); docs/rewards say the same.
@REWARDS.register("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500",
                  "minerva_math", "aime24", "aime2024", "amc23", "math")
def math_boxed(data_source, solution_str, ground_truth, extra_info=None):
    """MATH-style, 0 / 1: the boxed answer (boxes that disagree: none) equals the gold
    (``core.rewards.math_answer.is_equiv``: exact for integers and fractions, to the gold's written precision for
    decimals). Examples: '\\boxed{\\frac12}' vs '0.5' -> 1.0; '\\boxed{3} or \\boxed{4}' vs '4' -> 0.0."""
    pred = math_reward.boxed_answer(solution_str)
    return _result(1.0 if math_reward.is_equiv(pred, str(ground_truth)) else 0.0, pred)


@REWARDS.register("math_dapo", "dapo", "math_dapo_reasoning")
def math_dapo(data_source, solution_str, ground_truth, extra_info=None):
    """DAPO-Math, +1 / -1 (verl's ``math_dapo``): the last 'Answer:' line, else the boxed answer.
    Examples vs '34': 'Answer: 34' -> {'score': 1.0, 'acc': True, 'pred': '34'}; '\\boxed{34}' -> 1.0;
    'Answer: 33' -> -1.0."""
    return math_reward.compute_score_dapo(solution_str, str(ground_truth))


@REWARDS.register(*code_tests.SOURCES)
def code_unit_tests(data_source, solution_str, ground_truth, extra_info=None):
    """Code RL: the response's program run against the problem's unit tests in the tool sandbox (namespaces,
    ``tools.isolation``), score = share of tests passed (``core.rewards.code_tests``; verl sends these sources to
    Sandbox Fusion). Example: ('```python\\nprint(int(input()) * 2)\\n```', '{"inputs": ["2"], "outputs": ["4"]}')
    -> {'score': 1.0, 'acc': True, 'pred': '1/1 tests passed'}."""
    return code_tests.compute_score(solution_str, ground_truth)


def default_compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Dispatch on ``data_source`` through ``REWARDS``."""
    return REWARDS[data_source](data_source, solution_str, ground_truth, extra_info)


def load_reward_fn(path: str | Path, name: str = "compute_score") -> RewardFn:
    """A user's reward function ``name`` from the Python file ``path`` (verl's custom_reward_function)."""
    return FileRewardFn(str(Path(path).resolve()), name)


class FileRewardFn:
    """A reward function loaded from a file. It pickles as (path, name): reward worker processes start fresh
    (forkserver, not a fork of the Ray driver) and load the file again, where pickling the function itself would
    name a module that only the driver has."""

    def __init__(self, path: str, name: str):
        self.path, self.name = path, name
        if not Path(path).is_file():
            raise FileNotFoundError(f"custom reward file not found: {path}")
        module_name = f"hybridrl_custom_reward_{abs(hash(path))}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # its own functions pickle by reference inside this process
        spec.loader.exec_module(module)
        self.fn = getattr(module, name, None)
        if not callable(self.fn):
            raise AttributeError(f"custom reward file {path} has no function {name!r}")

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __reduce__(self):
        return FileRewardFn, (self.path, self.name)


__all__ = ["REWARDS", "RewardError", "RewardFn", "ScoredBatch", "default_compute_score", "load_reward_fn",
           "sample_names", "score_batch"]
