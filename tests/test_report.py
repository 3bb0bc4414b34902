"""End-of-run report: reward start/end windows, phase shares, the PNG, and bad metrics files named by line."""

import json

import pytest

from core.report import phase_shares, plot_curves, plotted_points, read_metrics, report, window


def history(n=10):
    return [{"step": i + 1, "reward/mean": i / 10, "response_length/mean": 30.0 - i,
             "timing_s/gen": 6.0, "timing_s/reward": 1.0, "timing_s/update_actor": 3.0, "timing_s/step": 10.0}
            for i in range(n)]


def test_windows_and_shares_hand_computed():
    h = history(10)
    assert window(h, "reward/mean", first=True) == (pytest.approx(0.05), 2)   # steps 1-2: (0.0 + 0.1) / 2
    assert window(h, "reward/mean", first=False) == (pytest.approx(0.85), 2)  # steps 9-10: (0.8 + 0.9) / 2
    assert window(h[:3], "reward/mean", first=True) == (0.0, 1)
    assert phase_shares(h) == {"gen": 0.6, "reward": 0.1, "update_actor": 0.3}  # no ref phase in this run


def test_report_text_and_png(tmp_path):
    pytest.importorskip("matplotlib")
    text = report(history(10), tmp_path / "curves.png")
    assert "start 0.050 -> end 0.850" in text and "gen 60% | reward 10% | update_actor 30%" in text
    assert "29.5 -> 21.5 tokens" in text and "100s in steps (10.0s per step)" in text
    png = (tmp_path / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


def test_validation_rows_give_the_held_out_line_and_stay_out_of_the_train_windows(tmp_path):
    h = [{"step": 0, "val/reward/mean": 0.25}] + history(10)
    h[-1]["val/reward/mean"] = 0.75
    text = report(h)
    assert "val/reward/mean (held-out, greedy): step 0 0.250 -> step 10 0.750" in text
    assert "start 0.050 -> end 0.850" in text and "(mean of the first / last 2 steps; 10 steps)" in text


def test_read_metrics_names_the_bad_line(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text(json.dumps(history(1)[0]) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 2 is not JSON"):
        read_metrics(p)


def coloured_pixels(png, rgb, tol=40) -> int:
    """How many pixels of the PNG are within ``tol`` (per channel) of the colour ``rgb``."""
    import numpy as np
    from PIL import Image

    with Image.open(png) as im:
        pixels = np.asarray(im.convert("RGB"), dtype=np.int32)
    return int((np.abs(pixels - np.array(rgb)) <= tol).all(-1).sum())


@pytest.mark.parametrize("critic", [False, True])
def test_the_png_holds_every_step_of_the_run(tmp_path, critic):
    """The curves are drawn from the run's rows whether or not there is a critic (its summary loop once reused the
    name of the rows to plot: without a critic both panels came out empty). Checked twice: the number of points
    of each drawn line, and the line colours present in the picture itself."""
    pytest.importorskip("matplotlib")
    h = [{"step": 0, "val/reward/mean": 0.25}] + history(10)
    h[-1]["val/reward/mean"] = 0.75
    if critic:
        for i, m in enumerate(h[1:]):
            m |= {"critic/vf_loss": 1.0 - i / 20, "critic/explained_var": i / 10}
    png = tmp_path / "curves.png"
    text = report(h, png)
    assert f"curves: {png}" in text and ("critic/vf_loss: 0.9750 -> 0.5750" in text) == critic
    critic_lines = {"value loss": 10, "explained variance": 10} if critic else {}
    assert plotted_points(png) == {"train (sampled)": 10, "held-out (greedy)": 2, "response length": 10} | critic_lines
    assert (coloured_pixels(png, (214, 39, 40)) > 300) == critic  # tab:red, the value loss (a third panel)
    assert coloured_pixels(png, (31, 119, 180)) > 300      # tab:blue, the train reward line and its markers
    assert coloured_pixels(png, (255, 127, 14)) > 300      # tab:orange, the response length line
    assert coloured_pixels(png, (44, 160, 44)) > 50        # tab:green, the held-out points


def test_critic_only_steps_are_shaded(tmp_path):
    """Steps with a critic update and no actor update (value pre-training / critic warm-up) get a grey band."""
    pytest.importorskip("matplotlib")
    h = history(10)
    for i, m in enumerate(h):
        m |= {"critic/vf_loss": 1.0 - i / 20}
        if i < 4:
            del m["timing_s/update_actor"]
    shaded = tmp_path / "warm.png"
    plot_curves(h, shaded)
    for m in h:
        m["timing_s/update_actor"] = 3.0
    plain = tmp_path / "plain.png"
    plot_curves(h, plain)
    grey = (236, 236, 236)  # the band (grey at alpha 0.12) over white
    assert coloured_pixels(shaded, grey, tol=6) > 3 * coloured_pixels(plain, grey, tol=6)  # measured 137,819 vs 18,538


def test_with_a_reward_model_the_first_panel_sets_its_score_against_the_truth(tmp_path):
    """A run trained on a reward model's score: the first panel draws that score (left axis) against the reward
    function's truth on the training samples and on the held-out problems (right axis), and the text quotes the
    truth and the model-truth correlation, start -> end."""
    pytest.importorskip("matplotlib")
    h = [{"step": 0, "val/reward/mean": 0.25}] + history(10)
    for i, m in enumerate(h[1:]):
        m |= {"reward/model_mean": i / 10, "reward/function_mean": 0.3 + i / 50, "reward/model_function_corr": 0.5}
    h[-1]["val/reward/mean"] = 0.5
    png = tmp_path / "curves.png"
    text = report(h, png)
    assert "reward/function_mean: 0.3100 -> 0.4700" in text  # steps 1-2: 0.30, 0.32; steps 9-10: 0.46, 0.48
    assert "reward/model_function_corr: 0.5000 -> 0.5000" in text
    assert plotted_points(png) == {"trained-on reward": 10, "truth: train samples": 10,
                                   "truth: held-out (greedy)": 2, "response length": 10}


def test_agent_runs_get_a_tool_use_panel_and_lines(tmp_path):
    """Agent rollouts: a third panel draws the tool-call rate (train, held-out) and the failed-call rate, and the
    text quotes them start -> end."""
    pytest.importorskip("matplotlib")
    h = [{"step": 0, "val/reward/mean": 0.25, "val/agent/tool_call_rate": 0.5}] + history(10)
    for i, m in enumerate(h[1:]):
        m |= {"agent/tool_call_rate": 0.5 + i / 20, "agent/tool_error_rate": 0.5 - i / 20, "agent/turns_mean": 1.5}
    h[-1] |= {"val/reward/mean": 0.75, "val/agent/tool_call_rate": 1.0}
    png = tmp_path / "curves.png"
    text = report(h, png)
    assert "agent/tool_call_rate: 0.5250 -> 0.9250" in text  # steps 1-2: 0.50, 0.55; steps 9-10: 0.90, 0.95
    assert "agent/tool_error_rate: 0.4750 -> 0.0750" in text
    assert "val/agent/tool_call_rate (held-out, greedy): step 0 0.500 -> step 10 1.000" in text
    assert plotted_points(png) == {"train (sampled)": 10, "held-out (greedy)": 2, "response length": 10,
                                   "calls a tool: train (sampled)": 10, "calls a tool: held-out (greedy)": 2,
                                   "failed calls per call: train": 10}


def test_several_held_out_sets_get_a_line_each(tmp_path):
    """Two validation data sources (a task and its blank-image control): one pass@1 line each in the PNG and the
    text, instead of their mixed mean reward."""
    pytest.importorskip("matplotlib")
    h = [{"step": 0, "val/reward/mean": 0.4, "val/a/pass@1": 0.5, "val/a_blank/pass@1": 0.25}] + history(10)
    h[-1] |= {"val/reward/mean": 0.6, "val/a/pass@1": 0.95, "val/a_blank/pass@1": 0.25}
    png = tmp_path / "curves.png"
    text = report(h, png)
    assert "val/a/pass@1 (held-out, greedy): step 0 0.500 -> step 10 0.950" in text
    assert "val/a_blank/pass@1 (held-out, greedy): step 0 0.250 -> step 10 0.250" in text
    assert plotted_points(png) == {"train (sampled)": 10, "held-out a pass@1": 2, "held-out a_blank pass@1": 2,
                                   "response length": 10}


def test_the_report_command_answers_help_and_a_missing_file_in_one_line(capsys, tmp_path):
    from core.report import main

    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0 and "metrics.jsonl" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main([str(tmp_path / "nope.jsonl")])
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and err[-1] == f"python -m core.report: error: {tmp_path / 'nope.jsonl'}: no such file"


def test_a_supervised_run_reports_its_loss_and_the_held_out_lines(tmp_path):
    """recipes/sft's history (no RL reward): the NLL windows, the held-out score and tool use, its own PNG."""
    pytest.importorskip("matplotlib")
    h = [{"step": 0, "val/reward/mean": 0.25, "val/agent/tool_call_rate": 0.5}]
    h += [{"step": i + 1, "sft/nll_loss": 1.0 / (i + 1), "sft/samples": 32, "timing_s/step": 4.0} for i in range(10)]
    h[-1] |= {"val/reward/mean": 1.0, "val/agent/tool_call_rate": 1.0}
    text = report(h, tmp_path / "curves.png")
    assert "sft/nll_loss: start 0.750 -> end 0.106 (mean of the first / last 2 steps; 10 steps, 320 samples)" in text
    assert "val/reward/mean (held-out, greedy): step 0 0.250 -> step 10 1.000" in text
    assert "val/agent/tool_call_rate (held-out, greedy): step 0 0.500 -> step 10 1.000" in text
    assert "40s in steps (4.0s per step)" in text
    assert plotted_points(tmp_path / "curves.png") == {"train NLL of the trained tokens": 10,
                                                       "held-out reward (greedy)": 2, "held-out: calls a tool": 2}
