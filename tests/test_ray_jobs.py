"""Ray Jobs for real: the 2-node Ray cluster of network namespaces (``tests/multinode.py``) with its dashboard and job
server, and ``ray job submit --working-dir . -- <entrypoint>`` from the other node, as a user submits from a laptop.
The entrypoint is ``deploy/kuberay_rayjob.yaml``'s (a full-scale recipe script) with overrides that make it tiny and
put it on the 2 CPU nodes; the cluster's ``RAY_JOB_STOP_WAIT_TIME_S`` is the manifest's too.

- the job runs to its end: SUCCEEDED, every step logged, checkpoints in the shared output dir, the output of the
  rank on the other node in the job's log (Ray tags a remote worker's lines with its node's IP);
- ``ray job stop`` is a preemption: the job server SIGTERMs the driver, which finishes its step, checkpoints and
  exits before the stop wait runs out; the same submit again resumes from that checkpoint and ends with the
  uninterrupted job's metrics (fp32).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from core import checkpoint
from core.report import read_metrics
from tests.multinode import RAY, ROOT, Cluster, namespaces_available
from tests.test_checkpoint import _rows, steady

pytestmark = [pytest.mark.ray, pytest.mark.multinode]

MANIFEST = yaml.safe_load((ROOT / "deploy" / "kuberay_rayjob.yaml").read_text())
STEPS = 5


def manifest_stop_wait_s() -> str:
    head = MANIFEST["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    return next(e["value"] for e in head["env"] if e["name"] == "RAY_JOB_STOP_WAIT_TIME_S")


def say(title: str, text: str) -> None:
    print("\n".join(f"[ray-jobs] {line}" for line in [f"{title}:", *text.rstrip().splitlines()]), flush=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = namespaces_available()
    if why:
        pytest.skip(f"the job server needs the cluster of namespaces: {why}")
    base = tmp_path_factory.mktemp("jobs")  # a short path: Ray's socket paths under it are at most 107 bytes
    with Cluster(base, cpus=[1, 1], dashboard=True, env={"RAY_JOB_STOP_WAIT_TIME_S": manifest_stop_wait_s()}) as c:
        yield c


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tiny_model_dir):
    from core.scaffold import tiny_data

    tmp = tmp_path_factory.mktemp("jobdata")
    tiny_data(tmp)  # 8 arithmetic prompts and a reward that varies with the text
    # that reward at 0.5 s a sample (~2 s a step): `ray job stop` lands inside the run, not after it
    (tmp / "slow_reward.py").write_text(
        (tmp / "reward.py").read_text().replace("def compute_score", "def score") + "\n\nimport time\n\n\n"
        "def compute_score(*args, **kwargs):\n    time.sleep(0.5)\n    return score(*args, **kwargs)\n")
    return tmp, Path(tiny_model_dir)


def entrypoint(tiny: tuple[Path, Path], out: Path, *extra: str) -> list[str]:
    """The manifest's entrypoint, made tiny: 2 nodes x 1 CPU slot, ``STEPS`` steps into ``out``, no held-out set."""
    from tests.test_full_scale_scripts import overrides

    data, model = tiny
    argv = shlex.split(MANIFEST["spec"]["entrypoint"])
    args = overrides("grpo/run_qwen2_7b_gsm8k.sh", data, model, out)
    args = [a for a in args if not a.startswith(("++placement.pools.main.nnodes", "++placement.pools.main.slots",
                                                 "++trainer.total_steps", "++trainer.save_freq"))]
    args += ["++placement.pools.main.nnodes=2", "++placement.pools.main.slots_per_node=1",
             f"++trainer.total_steps={STEPS}", "++trainer.save_freq=2", "++trainer.logger=[jsonl]", "++data.val_files=[]",
             f"++reward.path={data / 'slow_reward.py'}", "++reward.name=compute_score", *extra]
    return argv + args


def ray_job(cluster: Cluster, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    """``ray job <args>`` against the head's job server, run on node 1 from the checkout."""
    return cluster.run([RAY, "job", *args[:1], "--address", cluster.dashboard_url, *args[1:]], node=1,
                       timeout_s=timeout_s, env={"PYTHONUNBUFFERED": "1"})


def submit(cluster: Cluster, job_id: str, command: list[str], wait: bool) -> subprocess.CompletedProcess:
    """``ray job submit ... -- <command>``: Ray quotes each word of it for the job's shell."""
    return ray_job(cluster, "submit", "--submission-id", job_id, "--working-dir", ".",
                   *([] if wait else ["--no-wait"]), "--", *command)


def status(cluster: Cluster, job_id: str) -> str:
    """The job's status as the job server reports it (its SDK, run on node 1): PENDING, RUNNING, STOPPED, ..."""
    r = cluster.python("from ray.job_submission import JobSubmissionClient as C; "
                       f"print(C({cluster.dashboard_url!r}).get_job_status({job_id!r}).value)", node=1, timeout_s=60)
    return r.stdout.strip().splitlines()[-1] if r.returncode == 0 else r.stderr[-2000:]


def tail(text: str, lines: int = 30) -> str:
    """The last lines of a job's output, less progress bars and the submit's packaging notes."""
    noise = ("(raylet)", "packaging.py", "working_dir.py")
    keep = [x[:300] for x in text.splitlines()
            if x.strip() and not any(n in x for n in noise) and not x.lstrip().startswith("steps:")]
    return "\n".join(keep[-lines:])


@pytest.fixture(scope="module")
def whole(cluster, tiny, tmp_path_factory):
    """The tiny job submitted and followed to its end (``ray job submit`` streams its log): (out dir, the output)."""
    out = tmp_path_factory.mktemp("whole") / "out"
    started = time.time()
    r = submit(cluster, "grpo-whole", entrypoint(tiny, out), wait=True)
    say(f"ray job submit grpo-whole: exit {r.returncode} in {time.time() - started:.0f}s (tail)",
        tail(r.stdout + r.stderr))
    return out, r


def test_a_submitted_job_runs_across_both_nodes_to_its_end(cluster, whole):
    out, r = whole
    text = r.stdout + r.stderr
    assert r.returncode == 0 and "Job 'grpo-whole' succeeded" in text, text[-5000:]
    assert status(cluster, "grpo-whole") == "SUCCEEDED"
    assert [m["step"] for m in read_metrics(out / "metrics.jsonl")] == list(range(1, STEPS + 1))
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*")) == ["step_000004", "step_000005"]
    # the job's own log (`ray job logs`) holds the ranks' output from both nodes
    logs = ray_job(cluster, "logs", "grpo-whole", timeout_s=60).stdout
    assert f"ip={cluster.ips[1]}" in logs and "summary:" in logs, logs[-4000:]


def test_ray_job_stop_checkpoints_and_the_resubmitted_job_ends_with_the_uninterrupted_metrics(cluster, tiny, whole,
                                                                                              tmp_path):
    out = tmp_path / "out"
    command = entrypoint(tiny, out, "++trainer.save_freq=0")  # no periodic checkpoint: the only one is the stop's
    started = time.time()
    r = submit(cluster, "grpo-stopped", command, wait=False)
    assert r.returncode == 0, r.stdout + r.stderr
    deadline = time.time() + 300
    while not any(m["step"] == 2 for m in _rows(out / "metrics.jsonl")):
        assert time.time() < deadline and status(cluster, "grpo-stopped") in ("PENDING", "RUNNING"), \
            ray_job(cluster, "logs", "grpo-stopped").stdout[-4000:]
        time.sleep(0.2)
    stop = ray_job(cluster, "stop", "grpo-stopped", timeout_s=300)  # waits until the job has stopped
    stopped = time.time()
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert status(cluster, "grpo-stopped") == "STOPPED"
    logs = ray_job(cluster, "logs", "grpo-stopped", timeout_s=60).stdout
    say(f"ray job stop grpo-stopped, {stopped - started:.0f}s after submit: the job's log (tail)", tail(logs, 15))
    ckpt = checkpoint.find(out, "auto")
    assert ckpt is not None and ckpt.name in ("step_000002", "step_000003", "step_000004"), logs[-4000:]
    assert f"SIGTERM after step {int(ckpt.name[5:])}: checkpoint" in logs, logs[-4000:]
    # the same command again: it resumes from the stop's checkpoint
    r = submit(cluster, "grpo-resumed", command, wait=True)
    text = r.stdout + r.stderr
    say(f"ray job submit grpo-resumed: exit {r.returncode} (tail)", tail(text, 12))
    assert r.returncode == 0 and "Job 'grpo-resumed' succeeded" in text, text[-5000:]
    assert f"resumed from {ckpt}" in text, text[-4000:]
    want, got = steady(read_metrics(whole[0] / "metrics.jsonl")), steady(read_metrics(out / "metrics.jsonl"))
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    for s in want:
        assert got[s] == want[s], (s, {k: (got[s].get(k), want[s][k]) for k in want[s] if got[s].get(k) != want[s][k]})
    print(f"[ray-jobs] stopped after step {ckpt.name[5:].lstrip('0')}, resubmitted, resumed: {STEPS} steps = the "
          f"uninterrupted job's metrics; {time.time() - started:.0f}s in all", flush=True)
