"""core.compare: held-out scores of runs side by side, by step and by training time, hand-computed on small
histories; its PNG holds each run's points; its CLI refuses what it cannot read, naming it."""

import json

import pytest

from core.compare import compare, held_out_curve, main, score_at
from core.report import plotted_points

FAST = [{"step": 0, "val/reward/mean": 0.5}, {"step": 1, "timing_s/step": 10.0},
        {"step": 2, "timing_s/step": 10.0, "val/reward/mean": 0.9}]
SLOW = [{"step": 0, "val/reward/mean": 0.5}, {"step": 1, "timing_s/step": 5.0},
        {"step": 2, "timing_s/step": 5.0, "val/reward/mean": 0.6}, {"step": 3, "timing_s/step": 5.0},
        {"step": 4, "timing_s/step": 5.0, "val/reward/mean": 0.95}]


def test_the_curve_sums_step_times_up_to_each_validation():
    assert held_out_curve(FAST) == [(0, 0.0, 0.5), (2, 20.0, 0.9)]
    assert held_out_curve(SLOW) == [(0, 0.0, 0.5), (2, 10.0, 0.6), (4, 20.0, 0.95)]
    assert score_at(held_out_curve(SLOW), 15.0) == (2, 0.6)  # step 4 ends at 20 s: not yet
    assert score_at(held_out_curve(FAST), 19.9) == (0, 0.5)
    assert score_at(held_out_curve(FAST[1:]), 19.9) is None  # no validation before step 2's
    # a resumed run logs steps 1 and 2 again: each counts once, as last logged
    resumed = FAST + [{"step": 1, "timing_s/step": 10.0}, {"step": 2, "timing_s/step": 10.0, "val/reward/mean": 0.8}]
    assert held_out_curve(resumed) == [(0, 0.0, 0.5), (2, 20.0, 0.8)]


def test_the_table_puts_the_runs_at_equal_steps_and_equal_time(tmp_path):
    text = compare({"fast": FAST, "slow": SLOW}, png=tmp_path / "c.png")
    assert "| 2 | 0.900 (20 s) | 0.600 (10 s) |" in text and "| 4 |  | 0.950 (20 s) |" in text
    assert "  10 s: fast 0.500 (step 0), slow 0.600 (step 2)" in text
    assert "  20 s: fast 0.900 (step 2), slow 0.950 (step 4)" in text
    assert "first validation at or above fast's final 0.900: fast step 2 (20 s), slow step 4 (20 s)" in text
    assert "first validation at or above slow's final 0.950: slow step 4 (20 s), fast never" in compare(
        {"slow": SLOW, "fast": FAST})
    assert plotted_points(tmp_path / "c.png") == {"fast": 2, "slow": 3}


def test_hybridrl_compare_reads_run_folders(tmp_path, capsys):
    from core.cli import main as cli_main

    for name, rows in (("a", FAST), ("b", SLOW)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli_main(["compare", f"fast={tmp_path / 'a'}", f"slow={tmp_path / 'b' / 'metrics.jsonl'}"]) == 0
    assert "| 2 | 0.900 (20 s) | 0.600 (10 s) |" in capsys.readouterr().out


def test_the_cli_names_a_file_without_the_metric(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "timing_s/step": 1.0}) + "\n")
    with pytest.raises(SystemExit):
        main([f"a={path}"])
    assert f"{path}: no 'val/reward/mean' in its metrics" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["no-equals-sign"])
