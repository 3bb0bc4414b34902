"""Bench options: ``pytest bench/ --benchmark`` runs real sizes; without the flag every bench is a tiny smoke run.

Each bench measures ours and a baseline in the same run and reports their ratio (this machine is shared and
noisy: ratios carry across runs, absolute times do not). Results land in ``bench/results/<bench>.json``.
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
    """``report(name, **figures)``: print one line and save the figures as JSON for regression tracking."""

    def _report(name: str, **figures):
        line = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items())
        print(f"\n[bench] {name}: {line}")
        RESULTS.mkdir(exist_ok=True)
        record = {"bench": name, "full_size": full_size, "machine": platform.machine(),
                  "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **figures}
        (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=1))
        return record

    return _report
