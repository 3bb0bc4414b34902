"""Verifiable rewards, keyed by ``data_source``, with verl's signature so verl reward files work unchanged:

    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict   (dict: has "score")

``default_compute_score`` dispatches on ``data_source`` through ``REWARDS``; ``load_reward_fn(path, name)`` loads a
user's function from a file; ``score_batch`` scores many responses in parallel with a per-call timeout.
"""

from __future__ import annotations

import importlib.util
import math
import multiprocessing as mp
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from core.rewards import gsm8k, math_answer as math_reward

RewardFn = Callable[..., "float | dict"]


class RewardError(RuntimeError):
    """A reward function raised, timed out or returned NaN for a named sample."""


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


@REWARDS.register("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500",
                  "minerva_math", "aime24", "aime2024", "amc23", "math")
def math_boxed(data_source, solution_str, ground_truth, extra_info=None):
    """MATH-style: the last ``\\boxed{}`` answer, normalised. Example: '\\boxed{\\frac12}' vs '0.5' -> score 1.0."""
    pred = math_reward.last_boxed(solution_str)
    return _result(1.0 if math_reward.is_equiv(pred, str(ground_truth)) else 0.0, pred)


@REWARDS.register("math_dapo", "dapo")
def math_dapo(data_source, solution_str, ground_truth, extra_info=None):
    """DAPO-Math: 'Answer: x' format, +1 / -1. Example: 'Answer: 34' vs '34' -> {'score': 1.0, 'acc': True, ...}."""
    return math_reward.compute_score_dapo(solution_str, str(ground_truth))


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


@dataclass
class ScoredBatch:
    scores: torch.Tensor                                          # (B,) float32
    extras: dict[str, list] = field(default_factory=dict)         # other keys of dict results, per sample
    num_failed: int = 0                                           # samples that got the fallback score


def _timed_out():
    raise mp.TimeoutError()


def _call(fn, args):
    return fn(*args)


def sample_names(batch) -> list[str] | None:
    """How reward errors name a step's samples: the data row each came from and its group (the batch's ``where``
    -- 'file: row N', set at load -- and ``uid`` columns); None when the batch has no ``where`` (then 'sample i')."""
    if "where" not in batch:
        return None
    return [f"sample {i} ({w}, uid {u})" for i, (w, u) in enumerate(zip(batch["where"], batch["uid"]))]


def _check(name: str, source: str, solution: str, result: Any) -> tuple[float, dict]:
    value = result["score"] if isinstance(result, dict) else result
    if isinstance(result, dict) and "score" not in result:
        raise RewardError(f"reward for {name} (data_source={source!r}) returned a dict without 'score': {sorted(result)}")
    value = float(value)
    if not math.isfinite(value):  # inf would reach the advantages as inf, then nan: as bad as NaN
        raise RewardError(f"reward for {name} (data_source={source!r}) is {'NaN' if math.isnan(value) else value}; "
                          f"response starts {solution[:80]!r}")
    return value, ({k: v for k, v in result.items() if k != "score"} if isinstance(result, dict) else {})


def _call_in_process(fn, args, timeout_s: float):
    """``fn(*args)`` in this process, limited to ``timeout_s`` by SIGALRM where that is possible (the main thread
    of a Unix process: where the driver scores), so ``reward_timeout_s`` holds with ``reward_workers: 0`` too."""
    if timeout_s <= 0 or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        return fn(*args)

    def on_alarm(signum, frame):
        raise mp.TimeoutError()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return fn(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _pool_context():
    """forkserver: the reward workers fork from a small server process started once, never from the caller -- a
    Ray driver has threads (gRPC, the log monitor) that a fork would copy in whatever state they were in."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["core.rewards"])
    return ctx


def score_batch(fn: RewardFn, data_sources: Sequence[str], solutions: Sequence[str], ground_truths: Sequence[Any],
                extra_infos: Sequence[Any] | None = None, num_workers: int = 0, timeout_s: float = 10.0,
                fallback: float | None = None, names: Sequence[str] | None = None) -> ScoredBatch:
    """Score every response, each call limited to ``timeout_s``: in this process (``num_workers`` 0) by SIGALRM
    when this is the main thread; with ``num_workers > 0`` in a pool of processes (forkserver), where a stuck call
    is abandoned and the pool killed at the end. A call that raises, times out or gives NaN / inf raises
    ``RewardError`` naming the sample (``names[i]``, e.g. ``sample_names``; else 'sample i') -- or, with ``fallback``
    set, scores ``fallback`` and is counted."""
    n = len(solutions)
    extra_infos = extra_infos if extra_infos is not None else [None] * n
    args = [(data_sources[i], solutions[i], ground_truths[i], extra_infos[i]) for i in range(n)]
    scores, extras, failed = [0.0] * n, [{} for _ in range(n)], 0

    def name(i: int) -> str:
        return names[i] if names is not None else f"sample {i}"

    def settle(i: int, get: Callable[[], Any]):
        nonlocal failed
        try:
            scores[i], extras[i] = _check(name(i), data_sources[i], solutions[i], get())
        except Exception as e:
            if fallback is None:
                if isinstance(e, RewardError):
                    raise
                what = "timed out" if isinstance(e, mp.TimeoutError) else f"raised {type(e).__name__}: {e}"
                raise RewardError(f"reward for {name(i)} (data_source={data_sources[i]!r}) {what}; "
                                  f"response starts {solutions[i][:80]!r}") from e
            scores[i], failed = fallback, failed + 1

    if num_workers <= 0:
        for i in range(n):
            settle(i, lambda i=i: _call_in_process(fn, args[i], timeout_s))
    todo = list(range(n)) if num_workers > 0 else []
    while todo:  # a timed-out call blocks its worker: kill the pool, keep finished results, resubmit the rest
        pool = _pool_context().Pool(num_workers)
        try:
            pending = {i: pool.apply_async(_call, (fn, args[i])) for i in todo}
            for k, i in enumerate(todo):
                pending[i].wait(timeout_s)
                if pending[i].ready():
                    settle(i, pending[i].get)
                    continue
                settle(i, _timed_out)
                rest = todo[k + 1:]
                done = {j for j in rest if pending[j].ready()}
                for j in sorted(done):
                    settle(j, pending[j].get)
                todo = [j for j in rest if j not in done]
                break
            else:
                todo = []
        finally:
            pool.terminate()
    keys = sorted({k for e in extras for k in e})
    return ScoredBatch(torch.tensor(scores, dtype=torch.float32), {k: [e.get(k) for e in extras] for k in keys}, failed)
