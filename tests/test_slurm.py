"""SLURM for real: a 2-node cluster on one host (``tests/slurm.py``: slurmctld, munge and two slurmd, each node in
network, UTS and PID namespaces of its own), and ``deploy/slurm_ray.sbatch`` submitted to it as a user would.

- sinfo shows the two nodes idle and ``srun -N2 hostname`` runs on both;
- ``sbatch deploy/slurm_ray.sbatch run.sh``: the Ray head on nodeA, a Ray worker on nodeB, the driver on the head; a
  tiny GRPO run (2 nodes x 1 slot, backend ray) runs to its end, checkpoints in the shared output dir, exit 0, Ray
  stopped on both nodes after it;
- preemption: ``scancel --batch --signal=TERM`` (the batch shell only, as ``--signal=B:USR1@120`` before a time limit)
  -> the script forwards it to the driver, which checkpoints and exits 75 -> the script stops Ray and requeues the
  job -> the requeued job resumes from the checkpoint and ends with the uninterrupted run's metrics.
"""

import shutil
import sys
import time
from pathlib import Path

import pytest

from core.preemption import EXIT_PREEMPTED
from core.report import read_metrics
from tests.slurm import NODES, SlurmCluster, unavailable
from tests.test_checkpoint import _rows, steady, write_run

pytestmark = [pytest.mark.ray, pytest.mark.multinode]

ROOT = Path(__file__).resolve().parents[1]
SBATCH = ROOT / "deploy" / "slurm_ray.sbatch"
TWO_NODES = "placement.pools.main={nnodes: 2, slots_per_node: 1, cpus_per_slot: 1}"
STEPS = 5


def say(title: str, text: str) -> None:
    print("\n".join(f"[slurm] {line}" for line in [f"{title}:", *text.rstrip().splitlines()]), flush=True)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = unavailable()
    if why:
        pytest.skip(f"no SLURM cluster of namespaces here: {why}")
    tokens = set(ROOT.glob(".ray-token.*"))
    started = time.time()
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as c:
        print(f"[slurm] cluster up in {time.time() - started:.1f}s: {c.nodes}, controller {c.net.host_ip}")
        yield c
    for d in set(ROOT.glob(".ray-token.*")) - tokens:  # a job killed at teardown leaves its token folder
        shutil.rmtree(d, ignore_errors=True)


def submit(slurm: SlurmCluster, tmp_path: Path, model_dir: Path, out: Path, *overrides: str) -> str:
    """``sbatch deploy/slurm_ray.sbatch run.sh`` from the checkout, run.sh the tiny run on both nodes; the job id."""
    conf = write_run(tmp_path, model_dir, total_steps=STEPS, save_freq=2, backend="ray")
    script = tmp_path / "run.sh"
    # RAY_DEDUP_LOGS=0: each node's worker lines show (Ray folds a line two nodes print alike into the first's)
    script.write_text(f'#!/usr/bin/env bash\nexport RAY_DEDUP_LOGS=0\nexec "{sys.executable}" -m core.run --config-dir '
                      f'"{conf}" "trainer.output_dir={out}" "{TWO_NODES}" "$@"\n')
    # a node here has 1 CPU: the script's default of 64 per task does not fit
    r = slurm.run("sbatch", "--parsable", "--cpus-per-task=1", f"--output={tmp_path}/slurm-%j.out", str(SBATCH),
                  str(script), *overrides, cwd=ROOT)
    return r.stdout.strip().split(";")[0]


def job_log(tmp_path: Path, job: str) -> str:
    p = tmp_path / f"slurm-{job}.out"
    return p.read_text(errors="replace") if p.exists() else ""


def tail(log: str, lines: int = 40) -> str:
    """The log's last lines, less Ray's own (the raylets' repeated memory-monitor warnings, a state dump)."""
    keep = [x[:300] for x in log.splitlines() if x.strip() and "(raylet)" not in x and "[state-dump]" not in x]
    return "\n".join(keep[-lines:])


def ray_processes(slurm: SlurmCluster) -> list[str]:
    """Command lines of the jobs' Ray processes still alive (their paths hold the cluster's Ray temp dir)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit():
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if str(slurm.ray_tmp) in cmd:
                    found.append(cmd[:200])
        except OSError:
            continue
    return found


def no_ray_left(slurm: SlurmCluster) -> None:
    deadline = time.time() + 30
    while ray_processes(slurm) and time.time() < deadline:
        time.sleep(0.5)
    assert not ray_processes(slurm), ray_processes(slurm)
    assert not list(ROOT.glob(".ray-token.*"))


def test_sinfo_shows_two_idle_nodes_and_srun_runs_on_both(slurm):
    out = slurm.run("sinfo", "-N", "-o", "%N %P %t %c").stdout
    say("sinfo", out)
    assert {tuple(line.split()) for line in out.splitlines()[1:]} == {(n, "cpu*", "idle", "1") for n in NODES}
    r = slurm.run("srun", "-N2", "hostname", timeout_s=60)
    assert sorted(r.stdout.split()) == sorted(NODES), r.stderr
    assert slurm.run("srun", "-w", "nodeB", "hostname").stdout.strip() == "nodeB"
    say("srun -N2 hostname", r.stdout)


@pytest.fixture(scope="module")
def whole(slurm, tiny_model_dir, tmp_path_factory):
    """The tiny run submitted with the sbatch script, to its end: (tmp dir, job id, fields at the end, wall s)."""
    tmp = tmp_path_factory.mktemp("whole")
    started = time.time()
    job = submit(slurm, tmp, tiny_model_dir, tmp / "out")
    say("squeue", slurm.run("squeue").stdout)
    try:
        end = slurm.wait_job(job, timeout_s=300)
    finally:
        say(f"job {job} log (tail)", tail(job_log(tmp, job)))
    return tmp, job, end, time.time() - started


def test_the_sbatch_script_runs_a_ray_run_across_both_nodes_to_its_end(slurm, whole):
    tmp, job, end, wall = whole
    log = job_log(tmp, job)
    assert end["JobState"] == "COMPLETED" and end["ExitCode"] == "0:0", (end, log[-4000:])
    assert end["BatchHost"] == "nodeA" and end["NodeList"] == "nodeA,nodeB"
    metrics = read_metrics(tmp / "out" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1)), log[-3000:]
    # saved every 2 steps and after the last, the last 2 kept (save_keep)
    assert sorted(p.name for p in (tmp / "out" / "checkpoints").glob("step_*")) == ["step_000004", "step_000005"]
    # Ray saw two nodes; the ranks' output came from both (Ray tags a remote worker's lines with its node's IP)
    assert log.count(" 1 node_") >= 2, log[-4000:]
    assert f"ip={slurm.nodes['nodeB']}" in log, log[-4000:]
    no_ray_left(slurm)  # `ray stop` ran on both nodes as the script exited
    print(f"[slurm] job {job}: {STEPS} steps on nodeA+nodeB in {wall:.0f}s (submit to COMPLETED)")


def test_a_preempted_job_checkpoints_requeues_itself_and_resumes_to_the_uninterrupted_metrics(slurm, whole,
                                                                                             tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    started = time.time()
    # no periodic checkpoint: the only one is the preemption's
    job = submit(slurm, tmp_path, tiny_model_dir, out, "trainer.save_freq=0")
    deadline = time.time() + 300
    while not any(m["step"] == 2 for m in _rows(out / "metrics.jsonl")):
        state = slurm.job(job)["JobState"]
        assert state in ("PENDING", "RUNNING") and time.time() < deadline, (state, job_log(tmp_path, job)[-4000:])
        time.sleep(0.05)
    # the batch shell only: the script forwards SIGTERM to the driver. Not the job's steps (plain scancel --signal,
    # or --full): they are the Ray daemons, which would stop under the driver before its checkpoint
    slurm.run("scancel", "--batch", "--signal=TERM", job)
    signalled = time.time()
    seen: list = []
    try:
        end = slurm.wait_job(job, timeout_s=400, every_s=0.5, seen=seen)
    finally:
        say(f"job {job} log (tail)", tail(job_log(tmp_path, job), 60))
    log = job_log(tmp_path, job)
    say("JobState, Restarts as polled", " -> ".join(f"{s}/{r}" for s, r in seen))
    assert end["JobState"] == "COMPLETED" and end["ExitCode"] == "0:0" and end["Restarts"] == "1", (end, seen)
    assert "slurm_ray.sbatch: TERM -> driver" in log
    ckpt = log.split("SIGTERM after step ", 1)[1].split(":", 1)[0] if "SIGTERM after step " in log else "?"
    assert ckpt in ("2", "3", "4"), log[-4000:]
    assert f"SIGTERM after step {ckpt}: checkpoint" in log
    assert f"the driver exited {EXIT_PREEMPTED} (checkpoint written): requeueing job {job}" in log
    assert f"resumed from {out / 'checkpoints' / f'step_{int(ckpt):06d}'}" in log, log[-4000:]
    # the order in the job's log (appended across the requeue): signal, checkpoint, requeue, resume
    marks = ["TERM -> driver", f"SIGTERM after step {ckpt}: checkpoint", "requeueing job", "resumed from"]
    assert [log.index(m) for m in marks] == sorted(log.index(m) for m in marks)
    no_ray_left(slurm)  # the first run's Ray ended with its allocation, the second's by `ray stop`
    want, got = steady(read_metrics(whole[0] / "out" / "metrics.jsonl")), steady(read_metrics(out / "metrics.jsonl"))
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    for s in want:
        assert got[s] == want[s], (s, {k: (got[s].get(k), want[s][k]) for k in want[s] if got[s].get(k) != want[s][k]})
    print(f"[slurm] job {job}: SIGTERM {signalled - started:.0f}s after submit, checkpoint after step {ckpt}, requeued "
          f"and resumed, {STEPS} steps = the uninterrupted run's metrics; {time.time() - started:.0f}s in all")
