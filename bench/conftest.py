"""Bench options: ``pytest bench/ --benchmark`` runs real sizes; without the flag every bench is a tiny smoke run.

Each bench measures ours and a baseline in the same run and reports their ratio (the host may be shared and
noisy: ratios carry across runs, absolute times do not). Results land in ``bench/results/<bench>.json``; with
``--benchmark`` the tracked ratios are compared with ``bench/baselines/<machine kind>.json`` at the end of the
session (``bench/regress.py``): a regression beyond the tolerance fails the run, and ``bench/results/report.md``
and ``report.png`` are written. ``--save-baseline`` stores this run's ratios as the machine kind's baseline; a
kind with no baseline says so and writes this run's ratios to ``bench/results/baseline-candidate-<kind>.json``.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import pytest

RESULTS = Path(__file__).parent / "results"


def pytest_addoption(parser):
    parser.addoption("--benchmark", action="store_true", default=False,
                     help="run benchmarks at real sizes (default: tiny smoke sizes)")
    parser.addoption("--save-baseline", action="store_true", default=False,
                     help="with --benchmark: store this run's tracked ratios as bench/baselines/<machine kind>.json")


def pytest_sessionfinish(session, exitstatus):
    """Compare the run's tracked ratios with the stored baseline; write the markdown report and PNG."""
    from bench.regress import finish, machine_kind

    config = session.config
    records = getattr(config, "_bench_records", [])
    if not records or not config.getoption("--benchmark"):
        return
    lines, regressed = finish(records, machine_kind(), RESULTS, config.getoption("--save-baseline"))
    if regressed:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    config.get_terminal_writer().line("\n".join(lines))


@pytest.fixture(scope="session")
def full_size(request) -> bool:
    return request.config.getoption("--benchmark")


def median_time(fn: Callable[[], object], repeat: int, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` over ``repeat`` runs after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


@pytest.fixture
def report(request, full_size):
    """``report(name, tracked={ratio: 'higher'|'lower'}, timed=fn, **figures)``: print one line, save the figures as
    JSON, and hand the tracked ratios to the end-of-session comparison. ``timed``: our side's main operation; at
    full size pytest-benchmark times it once more (``timed_rounds`` runs) and stores that with the figures as
    ``extra_info`` in its own history (``--benchmark-autosave``, ``pytest-benchmark compare``)."""

    def _report(name: str, tracked: dict[str, str] | None = None, timed: Callable[[], object] | None = None,
                timed_rounds: int = 3, **figures):
        for k, better in (tracked or {}).items():
            if k not in figures or better not in ("higher", "lower"):
                raise ValueError(f"bench {name}: tracked ratio {k!r} must be a reported figure, 'higher' or 'lower'")
        line = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items())
        print(f"\n[bench] {name}: {line}")
        RESULTS.mkdir(exist_ok=True)
        record = {"bench": name, "full_size": full_size, "machine": platform.machine(),
                  "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "tracked": dict(tracked or {}), **figures}
        (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=1))
        request.config._bench_records = getattr(request.config, "_bench_records", []) + [record]
        if timed is not None and full_size and request.config.pluginmanager.hasplugin("benchmark"):
            benchmark = request.getfixturevalue("benchmark")
            benchmark.extra_info.update({k: v for k, v in figures.items() if isinstance(v, (int, float, str))})
            benchmark.pedantic(timed, rounds=timed_rounds, iterations=1)
        return record

    return _report
