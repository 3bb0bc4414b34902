"""A Ray cluster already up on the host (a user's ``ray start``, another test's) changes nothing: a run (``init_ray``
with no address) and the tests (``ray.init(address="local", ...)``) start a Ray of their own instead of joining it."""

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("from core.worker_group import init_ray; init_ray(num_cpus=2); import ray; "
        "print(ray.get_runtime_context().gcs_address)")
BARE = "import ray; ray.init(num_cpus=2)"  # what the tests did: it finds the running cluster and refuses num_cpus


def ray_processes() -> set[int]:
    """Pids of the host's processes that run Ray's binaries or modules."""
    import psutil

    found = set()
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        if any("/ray/" in a or a.startswith("ray::") for a in argv[:2]):
            found.add(proc.pid)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.heavy  # ~40 s: a `ray start` cluster and two drivers
def test_a_running_cluster_is_not_joined(tmp_path):
    # a host's environment, not this test process's: an earlier ray.init here set RAY_AUTH_MODE=token, and the
    # cluster's own HOME has no token for it
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env |= {"HOME": str(tmp_path), "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT)}
    ray = str(Path(sys.executable).with_name("ray"))
    port, before = free_port(), ray_processes()
    head = subprocess.run([ray, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=1",
                           "--include-dashboard=false"], env=env, capture_output=True, text=True, timeout=120)
    assert head.returncode == 0, (head.stdout + head.stderr)[-3000:]
    started = ray_processes() - before  # this cluster's; `ray stop` would stop every cluster on the host
    try:
        bare = subprocess.run([sys.executable, "-c", BARE], env=env, capture_output=True, text=True, timeout=120)
        assert bare.returncode != 0 and "connecting to an existing cluster" in bare.stderr, bare.stderr[-1500:]
        ours = subprocess.run([sys.executable, "-c", OURS], env=env, capture_output=True, text=True, timeout=180)
        assert ours.returncode == 0, ours.stderr[-2000:]
        assert ours.stdout.strip().splitlines()[-1] != f"127.0.0.1:{port}"
    finally:
        for pid in started:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
