"""A real 2-node Ray cluster on this machine: ``ray start --head`` and a second ``ray start --address`` whose raylet
(and so every worker it starts) lives in a mount namespace of its own, with a tmpfs over one folder -- a node whose
local disk the head cannot see, as on a cluster without shared storage. Runs go through ``python -m core.train``.

Needs root and ``unshare`` (skipped otherwise). The cluster has its own HOME (no stale ~/.ray auth token) and temp
dir (a later ``ray.init()`` elsewhere does not find it), and is killed by process group at the end."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.report import read_metrics
from core.worker import free_port
from tests.test_checkpoint import ROOT, write_run

pytestmark = [pytest.mark.ray,
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                 reason="a node with its own mounts needs root and unshare(1)")]

RAY = str(Path(sys.executable).with_name("ray"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(address, env for drivers, the folder only the head's node sees)."""
    base = tmp_path_factory.mktemp("cluster")
    home, temp, private = base / "home", base / "ray", base / "node-local"
    for d in (home, temp, private):
        d.mkdir()
    # nothing of this process's distributed or Ray settings (an in-process worker group sets RANK, MASTER_PORT, ...)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k not in
           ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env |= {"HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0"}
    port = free_port()
    common = ["--num-cpus=1", "--disable-usage-stats", "--block"]
    logs = [open(base / f"node{i}.log", "w") for i in range(2)]
    head = subprocess.Popen([RAY, "start", "--head", f"--port={port}", "--include-dashboard=false",
                             f"--temp-dir={temp}", *common], env=env, start_new_session=True,
                            stdout=logs[0], stderr=subprocess.STDOUT)
    nodes = [head]
    try:
        address = f"127.0.0.1:{port}"
        _wait_for_nodes(address, env, 1, base / "node0.log")
        nodes.append(subprocess.Popen(
            ["unshare", "-m", "sh", "-c", f'mount -t tmpfs none "{private}" && exec "$0" "$@"', RAY, "start",
             f"--address={address}", *common], env=env, start_new_session=True,
            stdout=logs[1], stderr=subprocess.STDOUT))
        _wait_for_nodes(address, env, 2, base / "node1.log")
        yield address, env | {"RAY_ADDRESS": address}, private
    finally:
        for p in nodes:  # each node's session: ray start, its GCS/raylet and every worker they started
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for f in logs:
            f.close()


def _wait_for_nodes(address: str, env: dict, n: int, log: Path, timeout_s: float = 60.0) -> None:
    probe = f"import ray; ray.init(address='{address}', log_to_driver=False); print(len(ray.nodes()))"
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip().endswith(str(n)):
            return
        time.sleep(1)
    raise RuntimeError(f"the test cluster at {address} did not reach {n} node(s) in {timeout_s:.0f}s; the last "
                       f"probe said:\n{r.stderr[-1500:]}\nray start said:\n{log.read_text()[-1500:]}")


def run(conf: Path, out: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "core.train", "--config-dir", str(conf),
                           f"trainer.output_dir={out}"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def two_node_run(tmp_path: Path, model_dir: Path) -> Path:
    conf = write_run(tmp_path, model_dir, total_steps=1, save_freq=1, backend="ray")
    with (conf / "config.yaml").open("a") as f:  # one rank on each node
        f.write("placement: {pools: {main: {nnodes: 2, slots_per_node: 1, cpus_per_slot: 1}}}\n")
    return conf


def test_a_node_local_output_dir_stops_the_run_before_step_one_naming_the_rank(cluster, tmp_path, tiny_model_dir):
    _, env, private = cluster
    out = private / "run"  # the head writes here; rank 1's node has its own empty tmpfs at this path
    r = run(two_node_run(tmp_path, tiny_model_dir), out, env)
    assert r.returncode != 0
    assert "is not shared by every rank: actor_rank" in r.stderr, r.stderr[-3000:]
    verdict = r.stderr.rsplit("is not shared by every rank", 1)[1]
    # Ray decides which rank lands on which node: exactly one of the two is on the node without the head's disk
    assert ("actor_rank0" in verdict) != ("actor_rank1" in verdict), verdict
    assert "cannot read" in verdict and "mounts at the same path" in verdict
    assert not (out / "checkpoints" / "latest").exists() and not (out / "metrics.jsonl").exists()


def test_on_shared_storage_a_two_node_run_trains_and_commits_its_checkpoint(cluster, tmp_path, tiny_model_dir):
    _, env, _ = cluster
    out = tmp_path / "run"  # /tmp: the same disk for both nodes
    r = run(two_node_run(tmp_path, tiny_model_dir), out, env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [m["step"] for m in read_metrics(out / "metrics.jsonl")] == [1]
    step = out / "checkpoints" / "step_000001" / "actor"
    assert sorted(p.name for p in step.glob("rng_rank*.pt")) == ["rng_rank0.pt", "rng_rank1.pt"]
    assert not (out / "checkpoints" / ".probe").exists()
