"""bench/regress.py: ratios compared with a stored baseline in their good direction, reports written, and (slow)
a deliberate slowdown of the real rollout bench fails the comparison against the committed baseline."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bench.regress import compare, load_baseline, machine_kind, write_report
from core.models import cpu_has_fast_bf16

ROOT = Path(__file__).resolve().parents[1]


def test_compare_flags_only_moves_in_the_bad_direction_beyond_the_tolerance():
    current = {"rollout": {"speedup": (1.4, "higher"), "frac": (0.28, "higher")},
               "dispatch": {"ratio": (7.0, "lower")}, "new": {"x": (1.0, "higher")}}
    baseline = {"rollout": {"speedup": (2.0), "frac": 0.30}, "dispatch": {"ratio": 5.0}}
    failures = compare(current, baseline, tolerance=0.25)
    # speedup 1.4 vs 2.0 = -30%: fails; frac -7%: noise; dispatch 7 vs 5 (lower is better) = -40%: fails;
    # a bench without a baseline is not compared
    assert failures == ["rollout.speedup: 1.4 vs baseline 2 (-30%; higher is better, tolerance 25%)",
                        "dispatch.ratio: 7 vs baseline 5 (-40%; lower is better, tolerance 25%)"]
    assert compare({"dispatch": {"ratio": (3.0, "lower")}}, baseline) == []  # faster is never a regression


def test_report_lists_every_tracked_ratio_with_its_change(tmp_path):
    current = {"rollout": {"speedup": (1.5, "higher")}, "sync": {"over_copy": (1.8, "lower")}}
    baseline = {"rollout": {"speedup": 2.0}, "sync": {"over_copy": 2.0}}
    written = write_report(current, baseline, ["rollout.speedup: ..."], tmp_path, "cpu-2c-x")
    md = (tmp_path / "report.md").read_text()
    assert "| rollout | speedup | higher | 1.5 | 2 | -25% |" in md and "**Regressions:**" in md
    assert "| sync | over_copy | lower | 1.8 | 2 | +10% |" in md  # lower is better: 10% faster shows as +10%
    assert written[0] == tmp_path / "report.md"


def test_machine_kind_names_the_device_and_the_bf16_hardware():
    kind = machine_kind()
    assert kind.startswith(("cpu-", "cuda-")) and (not kind.startswith("cpu-") or kind.split("-")[1].endswith("c"))


def test_a_cpu_kind_carries_its_matmul_speed_tier():
    """``-mm<tier>``: a power of two at or below the measured 1024^3 matmul peak of the run's compute dtype (within
    the drift of two measurements), so two machines of one flag set whose peaks differ by 2.5x get different
    baselines."""
    if torch.cuda.is_available():
        pytest.skip("a GPU kind is named by its device")
    tier = int(machine_kind().split("-mm")[1].split("-")[0])
    dtype = torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
    a = torch.randn(1024, 1024, dtype=dtype)
    a @ a
    t = time.perf_counter()
    for _ in range(5):
        a @ a
    rate = 2 * 1024**3 * 5 / (time.perf_counter() - t) / 1e9
    assert tier & (tier - 1) == 0 and rate / 4 <= tier <= rate * 1.5


@pytest.mark.slow
def test_a_deliberate_rollout_slowdown_fails_the_bench_comparison():
    """The real rollout bench on SmolLM2 (~1 min) with HYBRIDRL_BENCH_SLOWDOWN=1, against the committed baseline."""
    if load_baseline(machine_kind()) is None:
        pytest.skip(f"no committed baseline for machine kind {machine_kind()}")
    cmd = [sys.executable, "-m", "pytest", "bench/test_rollout.py", "--benchmark", "-q", "-p", "no:cacheprovider"]
    slow = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, HYBRIDRL_BENCH_SLOWDOWN="1"), capture_output=True,
                          text=True)
    assert slow.returncode == 1, slow.stdout[-2000:]
    assert "REGRESSION" in slow.stdout and "rollout.speedup_vs_generate" in slow.stdout


def test_a_machine_kind_without_a_baseline_says_so_and_writes_the_candidate(tmp_path):
    """No silent 'nothing compared': one line names the kind, and this run's ratios land in a candidate file that
    a second run (once committed as the baseline) compares against."""
    from bench.regress import finish

    records = [{"bench": "rollout", "tracked": {"speedup": "higher"}, "speedup": 2.0}]
    lines, regressed = finish(records, "cpu-2c-test", tmp_path / "results", save=False, baselines=tmp_path / "base")
    candidate = tmp_path / "results" / "baseline-candidate-cpu-2c-test.json"
    assert not regressed and any("NO BASELINE for machine kind 'cpu-2c-test'" in l and str(candidate) in l
                                 for l in lines)
    (tmp_path / "base").mkdir()
    candidate.rename(tmp_path / "base" / "cpu-2c-test.json")
    slower = [{"bench": "rollout", "tracked": {"speedup": "higher"}, "speedup": 1.0}]
    lines, regressed = finish(slower, "cpu-2c-test", tmp_path / "results", save=False, baselines=tmp_path / "base")
    assert regressed and any("rollout.speedup: 1 vs baseline 2" in l for l in lines)
