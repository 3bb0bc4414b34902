"""core.tracking: the console line, real offline trackers writing under the output folder, clear errors."""

import sys

import pytest

from core.tracking import Console, make_trackers

ROW = {"reward/mean": 0.5, "response_length/mean": 12.0, "actor/pg_loss": -0.01, "actor/kl_loss": 0.002,
       "timing_s/step": 3.25, "val/reward/mean": 0.75, "note": "text is skipped", "nan": float("nan")}


def test_console_prints_one_line_per_step_and_the_val_only_row():
    lines = []
    c = Console(lines.append)
    c.log(ROW, 3)
    c.log({"val/reward/mean": 0.4, "step": 0}, 0)
    c.log(ROW | {"distill/reverse_kl": 0.1234}, 4)  # a distillation run: its distance to the teacher
    assert lines == ["step 3: reward 0.500 | len 12 | pg_loss -0.0100 | kl 0.0020 | 3.2s | val 0.750",
                     "step 0: val reward 0.400",
                     "step 4: reward 0.500 | len 12 | pg_loss -0.0100 | kl 0.0020 | kl to teacher 0.1234 | 3.2s | "
                     "val 0.750"]


def test_swanlab_offline_writes_its_run_under_the_output_folder(tmp_path):
    pytest.importorskip("swanlab")
    [t] = make_trackers(["swanlab"], tmp_path, "hybridrl-test", "t", {"a": 1}, mode="offline")
    for s in (1, 2):
        t.log(ROW | {"reward/mean": s / 10}, s)
    t.close()
    assert any((tmp_path / "swanlab").rglob("*")), "swanlab wrote nothing under output_dir/swanlab"


def test_tensorboard_writes_scalars_that_read_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    [t] = make_trackers(["tensorboard"], tmp_path, "p", "t", {}, mode="offline")
    t.log(ROW, 7)
    t.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("reward/mean")] == [(7, 0.5)]
    assert "nan" not in acc.Tags()["scalars"] and "note" not in acc.Tags()["scalars"]


def test_a_missing_tracker_package_is_a_clear_error_at_start(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` meets where it is not installed
    with pytest.raises(ValueError, match=r"trainer.logger includes 'wandb' but 'wandb' is not importable.*pip install wandb"):
        make_trackers(["console", "wandb"], tmp_path, "p", "t", {})


def test_an_unknown_tracker_name_lists_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match=r"unknown tracker\(s\) \['mlflow'\]; known: \['console', 'jsonl'"):
        make_trackers(["mlflow"], tmp_path, "p", "t", {})


def test_wandb_offline_writes_its_run_under_the_output_folder(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    [t] = make_trackers(["wandb"], tmp_path, "hybridrl-test", "t", {"a": 1}, mode="offline")
    for s in (1, 2):
        t.log(ROW | {"reward/mean": s / 10}, s)
    t.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), "no offline run file under output_dir/wandb"
