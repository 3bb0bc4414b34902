"""Multi-node for real: a Ray cluster of two nodes on one host, each in its own network namespace with
its own IP (``tests/multinode.py``; ``ray.cluster_utils`` where namespaces cannot be made -- it says which), drivers
started inside the head's namespace as a user on the head node would.

- a gloo group across the nodes forms and all-reduces: every rank binds its collectives to the interface that
  carries its node's Ray IP (before, each advertised its hostname's address, loopback, and the ranks never met);
- a pool the cluster cannot hold fails before anything is placed, saying what Ray sees; a pool of two nodes lands on
  two distinct nodes;
- a worker that imports other code than the driver (a node with another checkout) is named, and the same run with
  ``trainer.runtime_env.working_dir`` (Ray ships the driver's code) passes;
- the GRPO config at tiny size on 2 nodes x 1 slot gives the metrics of 1 node x 2 slots exactly, and split
  placement with the actor on one node and the rollout on the other the metrics of the colocated run;
- a run whose output_dir is on one node's local disk stops before step 1 naming the rank that cannot see it;
- a node lost mid-run is named (role, rank, node) and the run stops naming the checkpoint to resume from; with the
  node back, the resumed run ends with the uninterrupted run's metrics.
"""

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from core.report import read_metrics
from tests.multinode import ROOT, Cluster
from tests.test_checkpoint import steady, write_run

pytestmark = [pytest.mark.ray, pytest.mark.multinode]


class Probe:
    """A role for the group tests: where it runs and a collective."""

    def __init__(self, ctx):
        self.ctx = ctx

    def where(self) -> tuple[str, str]:
        from core.worker import node_ip

        return node_ip(), os.environ.get("GLOO_SOCKET_IFNAME", "")

    def allreduce_rank_plus_one(self) -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([self.ctx.rank + 1.0])
        dist.all_reduce(t)
        return float(t)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("cluster")
    # 3 namespaces, 2 nodes running (node 2 is started by the test that needs a node with other code); node 1 has
    # a disk of its own at base/node-local (an empty tmpfs there: the head's files at that path are not its)
    with Cluster(base, cpus=[1, 1, 1], start=2, private={1: base / "node-local"}) as c:
        c.node_local = base / "node-local"
        yield c


GROUP = """
from core.worker import RoleSpec
from core.worker_group import ResourcePool, WorkerGroup, init_ray
init_ray("{address}", {runtime_env})
from tests.test_multinode import Probe
g = WorkerGroup(ResourcePool(nnodes={nnodes}, slots_per_node=1), {{"probe": RoleSpec(Probe)}}, name="probe",
                timeout_s=30, ready_timeout_s=60)
print("WHERE", g.role("probe").call_all(Probe.where))
print("SUM", g.role("probe").call_all(Probe.allreduce_rank_plus_one))
"""


def test_a_gloo_group_across_two_nodes_binds_each_rank_to_its_node_ip(cluster):
    r = cluster.python(GROUP.format(address=cluster.address, nnodes=2, runtime_env=None))
    assert r.returncode == 0, r.stderr[-3000:]
    where = eval(r.stdout.split("WHERE ", 1)[1].splitlines()[0])
    assert eval(r.stdout.split("SUM ", 1)[1].splitlines()[0]) == [3.0, 3.0]
    print(f"[multinode] {cluster.kind}: ranks at {where}")
    if cluster.kind == "namespaces":  # one rank on each node, each bound to the veth carrying its node's IP
        assert sorted(ip for ip, _ in where) == cluster.ips[:2]
        assert all(iface == f"{cluster.tag}e{cluster.ips.index(ip)}" for ip, iface in where)
    # a driver on the other node (not the head) joins the same cluster by its address
    r = cluster.python(GROUP.format(address=cluster.address, nnodes=2, runtime_env=None), node=1)
    assert r.returncode == 0 and "SUM [3.0, 3.0]" in r.stdout, r.stderr[-3000:]


def test_a_pool_the_cluster_cannot_hold_fails_before_placing_saying_what_ray_sees(cluster):
    r = cluster.python(GROUP.format(address=cluster.address, nnodes=3, runtime_env=None))
    assert r.returncode != 0
    assert "pool 'probe' asks for 3 node(s) x 1 slot(s) of {'CPU': 1.0} (a node must hold {'CPU': 1.0}), but only 2 " \
           "node(s) can" in r.stderr, r.stderr[-2000:]
    assert f"Ray sees 2 alive node(s): {cluster.ips[0]} (CPU 1); {cluster.ips[1]} (CPU 1)" in r.stderr


def test_a_node_with_other_code_is_named_and_runtime_env_ships_the_drivers(cluster, tmp_path):
    if cluster.kind != "namespaces":
        pytest.skip("needs a node started with its own environment (network namespaces)")
    other = tmp_path / "other"
    shutil.copytree(ROOT / "core", other / "core", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    with (other / "core" / "loop.py").open("a") as f:
        f.write("\n# another version of core\n")
    cluster.start_node(2, bind={ROOT / "core": other / "core"})  # node 2's checkout holds another core/
    try:
        r = cluster.python(GROUP.format(address=cluster.address, nnodes=3, runtime_env=None))
        assert r.returncode != 0
        assert f"on node {cluster.ips[2]}" in r.stderr and "runs other code than the driver" in r.stderr, r.stderr[-2000:]
        r = cluster.python(GROUP.format(address=cluster.address, nnodes=3, runtime_env={"working_dir": str(ROOT)}))
        assert r.returncode == 0, r.stderr[-3000:]
        assert eval(r.stdout.split("SUM ", 1)[1].splitlines()[0]) == [6.0, 6.0, 6.0]
    finally:
        cluster.stop_node(2)


# ---------------------------------------------------------------------------------------------- whole runs


def train(cluster, conf: Path, out: Path, *overrides: str, timeout_s: float = 300.0):
    """``python -m core.run`` as a driver on the head node of ``cluster`` (on a fresh local Ray when None)."""
    import subprocess

    args = [sys.executable, "-m", "core.run", "--config-dir", str(conf), f"trainer.output_dir={out}", *overrides]
    if cluster is None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    return cluster.run(args, timeout_s=timeout_s)


TWO_NODES = "placement.pools.main={nnodes: 2, slots_per_node: 1, cpus_per_slot: 1}"
SPLIT = ("placement.pools.main={nnodes: 1, slots_per_node: 1}", "placement.pools.gen={nnodes: 1, slots_per_node: 1}",
         "placement.roles={actor: main, ref: main, rollout: gen}")
ONE_SLOT = ("placement.pools.main={nnodes: 1, slots_per_node: 1}",)


def test_two_nodes_give_the_metrics_of_one_node_and_split_placement_those_of_colocated(cluster, tmp_path,
                                                                                         tiny_model_dir):
    conf = write_run(tmp_path, tiny_model_dir, total_steps=3, save_freq=0, backend="ray")
    across = train(cluster, conf, tmp_path / "across", TWO_NODES)
    assert across.returncode == 0, across.stderr[-3000:]
    one_node = train(None, conf, tmp_path / "one_node")  # the config's own pool: 1 node x 2 slots, a local Ray
    assert one_node.returncode == 0, one_node.stderr[-3000:]
    a, b = (steady(read_metrics(tmp_path / d / "metrics.jsonl")) for d in ("across", "one_node"))
    assert sorted(a) == [1, 2, 3] and a == b
    # the actor (and reference) on one node, the rollout on the other: weights cross the network at every sync
    split = train(cluster, conf, tmp_path / "split", *SPLIT)
    assert split.returncode == 0, split.stderr[-3000:]
    colocated = train(cluster, conf, tmp_path / "colocated", *ONE_SLOT)
    assert colocated.returncode == 0, colocated.stderr[-3000:]
    s, c = (steady(read_metrics(tmp_path / d / "metrics.jsonl")) for d in ("split", "colocated"))
    raw = {m["step"]: m for m in read_metrics(tmp_path / "split" / "metrics.jsonl")}
    # every sync sent something; after the first, deltas (rollout.sync_delta=auto: the sync crosses pools)
    assert all(raw[k]["sync/megabytes"] > 0 for k in raw) and [raw[k]["sync/full"] for k in sorted(raw)] == [1, 0, 0]
    # bucket counts differ by design; a rollout on a pool of its own counts replicas lost
    drop = lambda m: {k: v for k, v in m.items() if not k.startswith(("sync/", "rollout/replicas_lost",
                                                                      "rollout/groups_requeued"))}
    assert sorted(s) == [1, 2, 3] and {k: drop(v) for k, v in s.items()} == {k: drop(v) for k, v in c.items()}
    print(f"[multinode] {cluster.kind}: 2 nodes x 1 slot = 1 node x 2 slots on {len(a[3])} metrics x 3 steps; "
          f"split across nodes = colocated on {len(drop(s[3]))}; reward/mean {[a[i]['reward/mean'] for i in a]}")


def test_a_stream_across_two_nodes_equals_the_same_stream_on_one(cluster, tmp_path, tiny_model_dir):
    """trainer.async.mode=streaming with the actor on one node and the rollout on the other: groups admitted ahead,
    weight syncs over the network landing between decode steps, partial rollouts -- with a fixed overlap, the same
    metrics as the same split on one node."""
    conf = write_run(tmp_path, tiny_model_dir, total_steps=3, save_freq=0, backend="ray")
    stream = ("trainer.async.mode=streaming", "trainer.async.max_staleness=1", "trainer.async.overlap_steps=3",
              "trainer.async.chunk_steps=3", "algo.sampling.max_new_tokens=16", "algo.sampling.ignore_eos=true")
    across = train(cluster, conf, tmp_path / "across", *SPLIT, *stream)
    assert across.returncode == 0, across.stderr[-3000:]
    one_node = train(None, conf, tmp_path / "one_node", *SPLIT, *stream)
    assert one_node.returncode == 0, one_node.stderr[-3000:]
    a, b = (steady(read_metrics(tmp_path / d / "metrics.jsonl")) for d in ("across", "one_node"))
    drop = lambda m: {k: v for k, v in m.items() if not k.startswith("sync/")}
    assert sorted(a) == [1, 2, 3] and {k: drop(v) for k, v in a.items()} == {k: drop(v) for k, v in b.items()}
    assert a[3]["rollout/staleness_max"] == 1 and max(a[k]["rollout/partial_frac"] for k in a) > 0
    print(f"[multinode] {cluster.kind}: streaming across 2 nodes = on 1 node; partial_frac "
          f"{[a[k]['rollout/partial_frac'] for k in a]}")


def test_a_node_lost_mid_run_is_named_and_the_resumed_run_ends_as_the_uninterrupted_one(cluster, tmp_path,
                                                                                         tiny_model_dir):
    import subprocess
    import time

    if cluster.kind != "namespaces":
        pytest.skip("needs a node that can be stopped on its own (network namespaces)")
    conf = write_run(tmp_path, tiny_model_dir, total_steps=8, save_freq=2, backend="ray")
    whole = train(cluster, conf, tmp_path / "whole", TWO_NODES, "trainer.save_freq=0")
    assert whole.returncode == 0, whole.stderr[-3000:]
    out = tmp_path / "cut"
    args = [sys.executable, "-m", "core.run", "--config-dir", str(conf), f"trainer.output_dir={out}", TWO_NODES,
            "trainer.node_loss_timeout_s=30"]
    log = open(tmp_path / "driver.log", "w")
    driver = subprocess.Popen(cluster.command(args), cwd=ROOT, env=cluster.env | {"RAY_ADDRESS": cluster.address},
                              stdout=log, stderr=subprocess.STDOUT)
    latest = out / "checkpoints" / "latest"
    deadline = time.time() + 240
    while not latest.is_file() and driver.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert latest.is_file(), (tmp_path / "driver.log").read_text()[-3000:]
    cluster.stop_node(1)  # its raylet and every worker on it, during the step after the first checkpoint
    lost = time.time()
    code = driver.wait(timeout=120)
    waited = time.time() - lost
    log.close()
    text = (tmp_path / "driver.log").read_text()
    assert code != 0 and "RunStopped: the run stopped: role '" in text, text[-3000:]
    stopped = text.split("RunStopped: ", 1)[1]
    # the call in flight names its role (actor, rollout, ref: whichever phase the step was in), the lost rank and node
    assert re.match(r"the run stopped: role '(actor|rollout|ref)' rank \d failed in \w+\.\w+: worker process "
                    rf"\(pid \d+\) on node {re.escape(cluster.ips[1])} died", stopped), stopped
    kept = latest.read_text().strip()
    assert f"the last checkpoint is {out / 'checkpoints' / kept} (intact" in stopped
    assert waited < 30 + 30, waited  # named within node_loss_timeout_s (+ start-up of the shutdown)
    print(f"[multinode] node {cluster.ips[1]} lost; the driver stopped after {waited:.1f}s:\n{stopped[:600]}")
    cluster.start_node(1)
    resumed = train(cluster, conf, out, TWO_NODES)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {out / 'checkpoints' / kept}" in resumed.stdout
    a, b = (steady(read_metrics(d / "metrics.jsonl")) for d in (tmp_path / "whole", out))
    assert sorted(b) == list(range(1, 9)) and b[8] == a[8] and b == a


def test_a_node_lost_with_a_rollout_replica_on_it_and_the_run_ends_with_the_uninterrupted_metrics(cluster, tmp_path,
                                                                                                   tiny_model_dir):
    """3 nodes: the actor on one, 2 rollout replicas on the other two. A node with a rollout replica (not the head,
    not the actor's) is stopped after step 1: the driver names the lost replica, its rows go to the other one, the
    run ends; its metrics are the uninterrupted run's (the same samples and rewards; the rollout's own log-probs to
    their last bits, ``tests/test_rollout_replicas.py``)."""
    import subprocess
    import time

    if cluster.kind != "namespaces":
        pytest.skip("needs a node that can be stopped on its own (network namespaces)")
    conf = write_run(tmp_path, tiny_model_dir, total_steps=5, save_freq=0, backend="ray")
    place = ("placement.pools.main={nnodes: 1, slots_per_node: 1, cpus_per_slot: 1}",
             "placement.pools.gen={nnodes: 2, slots_per_node: 1, cpus_per_slot: 1}",
             "placement.roles={actor: main, rollout: gen}")
    cluster.start_node(2)
    try:
        whole = train(cluster, conf, tmp_path / "whole", *place)
        assert whole.returncode == 0, whole.stderr[-3000:]
        out = tmp_path / "lost"
        args = [sys.executable, "-m", "core.run", "--config-dir", str(conf), f"trainer.output_dir={out}", *place]
        log = open(tmp_path / "driver.log", "w")
        driver = subprocess.Popen(cluster.command(args), cwd=ROOT, env=cluster.env | {"RAY_ADDRESS": cluster.address},
                                  stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 240
        while driver.poll() is None and time.time() < deadline and not (
                (out / "metrics.jsonl").is_file() and '"step": 1' in (out / "metrics.jsonl").read_text()):
            time.sleep(0.05)
        text = (tmp_path / "driver.log").read_text()
        where = text.split("placement: ", 1)[1].splitlines()[0]
        actor_ip = re.search(r"pool main \([^)]*\): (\S+) ranks", where).group(1)
        rollout = dict(re.findall(r"(\d+\.\d+\.\d+\.\d+) ranks \[(\d)\]", where.split("pool gen", 1)[1]))
        node = next(i for i in (1, 2) if cluster.ips[i] in rollout and cluster.ips[i] != actor_ip)
        cluster.stop_node(node)
        assert driver.wait(timeout=180) == 0, (tmp_path / "driver.log").read_text()[-3000:]
        log.close()
        text = (tmp_path / "driver.log").read_text()
        rank = rollout[cluster.ips[node]]
        said = re.search(rf"rollout replica {rank} \(rank {rank}\) lost in .*", text)
        assert said and f"on node {cluster.ips[node]}" in said.group(0), text[-3000:]
        a, b = (steady(read_metrics(d / "metrics.jsonl")) for d in (tmp_path / "whole", out))
        assert sorted(b) == [1, 2, 3, 4, 5] and b[5]["rollout/replicas_lost"] == 1
        same = ("reward/", "response_length/", "actor/", "critic/")
        assert all({k: v for k, v in b[s].items() if k.startswith(same)}
                   == {k: v for k, v in a[s].items() if k.startswith(same)} for s in a)
        print(f"[multinode] node {cluster.ips[node]} with rollout rank {rank} lost after step 1: {said.group(0)[:300]}")
    finally:
        cluster.stop_node(2)
        if 1 not in cluster.procs:
            cluster.start_node(1)


def test_a_node_local_output_dir_stops_the_run_before_step_one_naming_the_rank(cluster, tmp_path, tiny_model_dir):
    if cluster.kind != "namespaces":
        pytest.skip("needs a node with a disk of its own (a mount namespace)")
    out = cluster.node_local / "run"  # the head writes here; node 1 has its own empty tmpfs at this path
    r = train(cluster, write_run(tmp_path, tiny_model_dir, total_steps=1, save_freq=1, backend="ray"), out, TWO_NODES)
    assert r.returncode != 0
    assert "is not shared by every rank: actor_rank" in r.stderr, r.stderr[-3000:]
    verdict = r.stderr.rsplit("is not shared by every rank", 1)[1]
    # Ray decides which rank lands on which node: exactly one of the two is on the node without the head's disk
    assert ("actor_rank0" in verdict) != ("actor_rank1" in verdict), verdict
    assert f"on node {cluster.ips[1]}" in verdict and "cannot read" in verdict and "mounts at the same path" in verdict
    assert not (out / "checkpoints" / "latest").exists() and not (out / "metrics.jsonl").exists()
