"""Scoring a batch: every response through a reward function, each call limited in time, failures named.

``score_batch`` is what the loop and eval call; the registry and the scorers live in ``core.rewards``.

Why every call runs in a reward worker process, ``reward_workers: 0`` too: the limit holds only if whatever a call is
doing can be stopped, and only killing its process does that. A SIGALRM in the caller (the earlier in-process path)
waits for a call inside C (a backtracking ``re`` match, a huge ``int``) to come back to the interpreter, and
``math_verify`` sets and cancels ``signal.alarm`` itself in ``parse`` / ``verify``, which cancelled ours.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

import torch

RewardFn = Callable[..., "float | dict"]


class RewardError(RuntimeError):
    """A reward function raised, timed out or returned NaN for a named sample."""


@dataclass
class ScoredBatch:
    scores: torch.Tensor                                          # (B,) float32
    extras: dict[str, list] = field(default_factory=dict)         # other keys of dict results, per sample
    num_failed: int = 0                                           # samples that got the fallback score


class _RemoteTraceback(Exception):
    """The worker-side traceback of a reward function's exception, attached as its ``__cause__``."""

    def __str__(self):
        return "\n" + self.args[0]


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


def _pool_context():
    """forkserver: the reward workers fork from a small server process started once, never from the caller -- a
    Ray driver has threads (gRPC, the log monitor) that a fork would copy in whatever state they were in."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["core.rewards"])
    return ctx


def _serve(conn) -> None:
    """A reward worker: gets (pickled fn, [(i, args), ...]), sends (i, ok, result or exception, traceback, now)
    after each call -- ``now`` is when its next call starts (CLOCK_MONOTONIC is one clock for all processes) --
    and, after unpickling a new fn, (None, ok, error, "", now). Returns when the caller closes the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle; it kills us
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a scheduler's too (see _sigterm_blocked)
    blob = fn = None
    while True:
        try:
            got, calls = conn.recv()
        except EOFError:
            return
        if got != blob:
            try:
                fn, blob = pickle.loads(got), got
                conn.send((None, True, None, "", time.monotonic()))
            except Exception as e:
                conn.send((None, False, f"{type(e).__name__}: {e}", "", time.monotonic()))
                continue
        for i, args in calls:
            try:
                out = (i, True, fn(*args), "")
            except BaseException as e:  # SystemExit too: the sample failed, this worker goes on
                out = (i, False, e, traceback.format_exc())
            try:
                conn.send(out + (time.monotonic(),))
            except Exception as e:  # the result or exception does not pickle
                conn.send((i, False, RuntimeError(f"{type(out[2]).__name__} cannot be sent back: {e}"), out[3],
                           time.monotonic()))


@contextlib.contextmanager
def _sigterm_blocked():
    """SIGTERM blocked in this thread while it starts a worker (and, the first time, the forkserver): both inherit
    the mask, so neither dies of a scheduler's SIGTERM -- ``ray job stop`` and SLURM signal every process of a job,
    and the driver, finishing its step before it checkpoints (core/preemption.py), still needs them. The driver ends
    them itself: EOF on their pipe, SIGKILL past a limit. (multiprocessing's resource tracker, started first, unblocks
    SIGTERM in the starting thread once it is up: so it starts before the block. It ignores SIGTERM itself.)"""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def _main_without_unreadable_file():
    """A script read from stdin (``python - <<EOF``) has ``__main__.__file__ == '<stdin>'``: multiprocessing would
    have the worker re-import ``__main__`` from that path, and it dies before serving. Such a ``__main__`` is left
    out of the worker's preparation, as ``python -c`` leaves it (its functions reach the worker by value)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or getattr(main, "__spec__", None) is not None or os.path.isfile(path):
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


class _Worker:
    """One reward process (forkserver) and the pipe to it. ``todo``: the samples sent to it and not answered yet,
    in the order it runs them; ``deadline``: when the first of them must have answered."""

    def __init__(self):
        ctx = _pool_context()
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child,), daemon=True, name="hybridrl-reward")
        with _main_without_unreadable_file(), _sigterm_blocked():
            self.proc.start()
        child.close()  # the worker's end lives in the worker alone: its death reads as EOF here
        self.todo: list[int] = []
        self.deadline = math.inf
        self.blob, self.loaded = b"", False  # the function it has or is loading, and whether it has it

    def kill(self) -> None:
        self.proc.kill()  # SIGKILL: ends it wherever it is, in C or under its own SIGALRM handler
        self.proc.join(1)
        self.conn.close()


_WORKERS: list[_Worker | None] = []  # kept across calls: a start costs tens of ms; None: start one when needed
_OWNER = os.getpid()                 # a fork of this process must not use (or kill) its parent's workers
_LOCK = threading.Lock()
_LOAD_S = 60.0  # a fresh worker's start-up and its loading of the function (importing a module, running a file)


@atexit.register
def _shutdown() -> None:
    while _WORKERS and _OWNER == os.getpid():
        if (w := _WORKERS.pop()) is not None:
            w.kill()


def _unusable(fn: RewardFn, why: str) -> str:
    return (f"reward function {getattr(fn, '__qualname__', fn)!r} cannot run in a reward worker process, which the "
            f"time limit needs ({why}); make it a module-level function of an importable module, or a file reward "
            f"(reward.path / reward.name)")


def _dump(fn: RewardFn) -> bytes:
    """``fn`` as the workers get it: by reference where it can be (a module-level function, ``FileRewardFn``), else
    by value through cloudpickle (ray's copy; ray is a dependency): a lambda or closure, whose captured values are
    then copies. A function neither can send is an error here, never a weaker limit."""
    try:
        return pickle.dumps(fn)
    except Exception as by_reference:
        try:
            from ray import cloudpickle
            return cloudpickle.dumps(fn)
        except Exception as e:
            raise RewardError(_unusable(fn, f"{type(e).__name__}: {e}")) from by_reference


def score_batch(fn: RewardFn, data_sources: Sequence[str], solutions: Sequence[str], ground_truths: Sequence[Any],
                extra_infos: Sequence[Any] | None = None, num_workers: int = 0, timeout_s: float = 10.0,
                fallback: float | None = None, names: Sequence[str] | None = None) -> ScoredBatch:
    """Score every response in ``max(1, num_workers)`` reward worker processes, each call limited to ``timeout_s``
    (<= 0: no limit). A call past its limit has its process killed and replaced (results already in are kept, the
    rest of its share goes to the next free worker); the workers live on, module-wide, for the next call. A call
    that raises, times out or gives NaN / inf raises ``RewardError`` naming the sample (``names[i]``, e.g.
    ``sample_names``; else 'sample i') -- or, with ``fallback`` set, scores ``fallback`` and is counted. ``fn`` must
    pickle (see ``_dump``)."""
    global _OWNER
    n = len(solutions)
    extra_infos = extra_infos if extra_infos is not None else [None] * n
    args = [(data_sources[i], solutions[i], ground_truths[i], extra_infos[i]) for i in range(n)]
    scores, extras, failed = [0.0] * n, [{} for _ in range(n)], 0
    limit = timeout_s if timeout_s > 0 else math.inf

    def name(i: int) -> str:
        return names[i] if names is not None else f"sample {i}"

    def settle(i: int, ok: bool, value: Any):
        nonlocal failed
        try:
            if not ok:
                raise value
            scores[i], extras[i] = _check(name(i), data_sources[i], solutions[i], value)
        except Exception as e:
            if fallback is None:
                if isinstance(e, RewardError):
                    raise
                what = "timed out" if isinstance(e, mp.TimeoutError) else f"raised {type(e).__name__}: {e}"
                raise RewardError(f"reward for {name(i)} (data_source={data_sources[i]!r}) {what}; "
                                  f"response starts {solutions[i][:80]!r}") from e
            scores[i], failed = fallback, failed + 1

    blob, todo = (_dump(fn), deque(range(n))) if n else (b"", deque())
    with _LOCK:
        if _OWNER != os.getpid():
            _WORKERS.clear()
            _OWNER = os.getpid()
        while len(_WORKERS) > max(1, num_workers):
            if (w := _WORKERS.pop()) is not None:
                w.kill()
        _WORKERS.extend([None] * (max(1, num_workers) - len(_WORKERS)))
        share = max(1, math.ceil(n / (4 * len(_WORKERS))))  # a few shares per worker: the slow ones even out

        def lose(k: int, w: _Worker, why: Exception):  # the first of its samples failed; requeue the others
            w.kill()
            _WORKERS[k] = None
            todo.extendleft(reversed(w.todo[1:]))
            settle(w.todo[0], False, why)

        try:
            while todo or any(w is not None and w.todo for w in _WORKERS):
                for k, w in enumerate(_WORKERS):
                    if todo and (w is None or not w.todo):
                        if w is None or not w.proc.is_alive():
                            if w is not None:
                                w.kill()
                            w = _WORKERS[k] = _Worker()
                        w.todo = [todo.popleft() for _ in range(min(share, len(todo)))]
                        w.loaded = w.loaded and w.blob == blob
                        w.deadline = time.monotonic() + (limit if w.loaded else max(limit, _LOAD_S))
                        w.blob = blob
                        w.conn.send((blob, [(i, args[i]) for i in w.todo]))  # it is idle: reads all of it now
                busy = [(k, w) for k, w in enumerate(_WORKERS) if w is not None and w.todo]
                first = min(w.deadline for _, w in busy) - time.monotonic()
                ready = wait([w.conn for _, w in busy], None if first == math.inf else max(0.0, first))
                for k, w in busy:
                    if w.conn in ready:
                        try:
                            i, ok, value, tb, now = w.conn.recv()
                        except (EOFError, OSError):
                            w.proc.join(1)
                            lose(k, w, RuntimeError(f"its reward worker process died (exit code {w.proc.exitcode})"))
                            continue
                        if i is None and ok:
                            w.loaded, w.deadline = True, now + limit
                            continue
                        if i is None:
                            w.todo = []
                            raise RewardError(_unusable(fn, f"unpickling it there: {value}"))
                        w.todo.pop(0)
                        w.deadline = now + limit
                        if not ok and tb:
                            value.__cause__ = _RemoteTraceback(tb)
                        settle(i, ok, value)
                    elif time.monotonic() >= w.deadline:
                        if not w.loaded:
                            raise RewardError(_unusable(fn, f"not loaded there after {max(limit, _LOAD_S):g} s"))
                        lose(k, w, mp.TimeoutError())
        finally:  # leaving early (a RewardError): a worker still busy would answer the next batch with these
            for k, w in enumerate(_WORKERS):
                if w is not None and w.todo:
                    w.kill()
                    _WORKERS[k] = None
    keys = sorted({k for e in extras for k in e})
    return ScoredBatch(torch.tensor(scores, dtype=torch.float32), {k: [e.get(k) for e in extras] for k in keys}, failed)
