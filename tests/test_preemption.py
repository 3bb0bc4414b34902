"""Preemption (core/preemption.py): a scheduler's SIGTERM ends the run after the step in progress with a checkpoint
and exit code 75; the same command resumes it, and the metrics equal an uninterrupted run's (fp32) -- with a
worker signalled before the driver too (a scheduler signals every process of a job). Real processes, real signals."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core import checkpoint
from core.preemption import EXIT_PREEMPTED
from core.report import read_metrics
from tests.test_checkpoint import _rows, steady, write_run

ROOT = Path(__file__).resolve().parents[1]


def start(conf: Path, out: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "core.run", "--config-dir", str(conf),
                             f"trainer.output_dir={out}", *overrides], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for_step(run: subprocess.Popen, out: Path, step: int) -> None:
    deadline = time.time() + 300
    while not any(m["step"] == step for m in _rows(out / "metrics.jsonl")):
        assert run.poll() is None and time.time() < deadline, f"the run ended before step {step} was logged"
        time.sleep(0.005)


def ray_workers(session: int) -> list[int]:
    """The pids of the run's Ray worker processes (the driver's session; Ray names them ``ray::WorkerHost...``)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.getsid(int(proc.name)) == session and \
                    (proc / "cmdline").read_bytes().startswith(b"ray::WorkerHost"):
                pids.append(int(proc.name))
        except (OSError, ProcessLookupError):
            continue
    return pids


def resumed_equals_whole(conf: Path, tmp_path: Path, out: Path, *overrides: str) -> None:
    whole = start(conf, tmp_path / "whole", *overrides)
    assert whole.wait(timeout=300) == 0, whole.stderr.read()[-3000:]
    resumed = start(conf, out, *overrides)  # trainer.resume_mode=auto
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()[-3000:]
    want, got = steady(read_metrics(tmp_path / "whole" / "metrics.jsonl")), steady(read_metrics(out / "metrics.jsonl"))
    assert sorted(got) == sorted(want) == [1, 2, 3, 4, 5, 6]
    for s in want:
        assert got[s] == want[s], (s, {k: (got[s].get(k), want[s][k]) for k in want[s] if got[s].get(k) != want[s][k]})


@pytest.mark.heavy  # three tiny runs, ~30 s
def test_sigterm_checkpoints_the_step_in_progress_and_the_rerun_resumes_to_the_same_metrics(tmp_path, tiny_model_dir):
    conf = write_run(tmp_path, tiny_model_dir, total_steps=6, save_freq=0)  # no periodic checkpoint at all
    out = tmp_path / "preempted"
    run = start(conf, out)
    wait_for_step(run, out, 2)
    run.send_signal(signal.SIGTERM)  # inside step 3 (or just after step 2)
    assert run.wait(timeout=120) == EXIT_PREEMPTED
    err = run.stderr.read()
    step = checkpoint.find(out, "auto")
    assert step is not None and step.name in ("step_000002", "step_000003"), err[-2000:]
    assert f"SIGTERM after step {int(step.name[5:])}: checkpoint" in err and "run the same command to resume" in err
    print(err[-1500:])
    resumed_equals_whole(conf, tmp_path, out)


@pytest.mark.heavy  # two Ray runs of 2 ranks and the resume, ~1 min 30 s
def test_a_worker_signalled_before_the_driver_does_not_turn_the_stop_into_a_crash(tmp_path, tiny_model_dir):
    """SIGTERM to both Ray workers first (a scheduler signals every task), then to the driver: the workers carry on,
    the driver finishes its step, checkpoints, exits 75, and the rerun resumes to the uninterrupted metrics."""
    conf = write_run(tmp_path, tiny_model_dir, total_steps=6, save_freq=0, backend="ray")
    out = tmp_path / "preempted"
    run = start(conf, out)
    wait_for_step(run, out, 1)
    workers = ray_workers(run.pid)
    assert len(workers) == 2, workers
    for pid in workers:
        os.kill(pid, signal.SIGTERM)
    time.sleep(0.3)
    assert all(Path(f"/proc/{pid}").exists() for pid in workers)  # they outlived it
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=180) == EXIT_PREEMPTED, run.stderr.read()[-3000:]
    err = run.stderr.read()
    print(err[-2000:])
    assert checkpoint.find(out, "auto") is not None
    resumed_equals_whole(conf, tmp_path, out)


@pytest.mark.heavy  # one tiny run, ~15 s
def test_a_step_that_outlasts_the_deadline_is_abandoned_and_the_run_exits_at_once(tmp_path, tiny_model_dir):
    """A reward that takes 30 s a call: SIGTERM during the step, trainer.preempt_deadline_s=1 -- the run exits 75
    within seconds, without a new checkpoint, saying where a rerun resumes (here: nowhere yet)."""
    conf = write_run(tmp_path, tiny_model_dir, total_steps=6, save_freq=0)
    inside = tmp_path / "in_reward"  # the reward marks its first call: the signal lands inside step 1's reward
    (tmp_path / "reward.py").write_text(f"import pathlib, time\n\ndef compute_score(data_source, solution_str, "
                                        f"ground_truth, extra_info=None):\n    pathlib.Path({str(inside)!r}).touch()\n"
                                        "    time.sleep(30)\n    return 0.0\n")
    out = tmp_path / "slow"
    run = start(conf, out, "trainer.preempt_deadline_s=1", "algo.reward_timeout_s=60")
    deadline = time.time() + 300  # a first run on a fresh checkout loads slowly: wait for the reward, not a guess
    while not inside.exists():
        assert run.poll() is None and time.time() < deadline, run.stderr.read()[-2000:] if run.poll() else ""
        time.sleep(0.05)
    sent = time.time()
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=60) == EXIT_PREEMPTED
    assert time.time() - sent < 15  # not the 30 s reward, nor the step
    err = run.stderr.read()
    assert ("SIGTERM during step 1, abandoned (it did not end within trainer.preempt_deadline_s=1s); no checkpoint "
            "yet: a rerun starts over") in err, err[-2000:]


def test_auto_with_a_dead_recorded_cluster_is_refused_at_once(tmp_path, monkeypatch):
    """RAY_ADDRESS=auto and a `ray start` record naming a cluster that is gone: one line naming it, in seconds --
    ray.init would retry it without end (seen: the 32B scripts' default hung for 10 minutes)."""
    import socket

    from core import worker_group
    from core.config.errors import ConfigError

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    record = tmp_path / "ray_current_cluster"
    record.write_text(f"127.0.0.1:{port}\n")
    monkeypatch.setattr(worker_group, "RAY_CURRENT_CLUSTER", record)
    t = time.time()
    with pytest.raises(ConfigError, match=rf"the cluster `ray start` recorded in .* \(127.0.0.1:{port}\) does not "
                                          "answer: start it"):
        worker_group.check_recorded_cluster()
    assert time.time() - t < 5
    record.unlink()
    worker_group.check_recorded_cluster()  # nothing recorded: ray.init's own error, which comes at once
