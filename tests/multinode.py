"""A real multi-node Ray cluster on one host, for tests: one network namespace per node, each with its own IP on
a bridge (10.77.<k>.10, .11, ...), ``ray start --head`` in the first and ``ray start --address`` in the others, the
driver run inside the head's namespace (``Cluster.run``). Needs root and iproute2's ``ip``; without them it falls
back to ``ray.cluster_utils.Cluster`` (distinct node ids, one IP: no cross-node network to get wrong) and says so
(``Cluster.kind``). Teardown always runs: every node's process group killed, namespaces, links and bridge deleted.

The cluster has its own HOME (no stale ~/.ray auth token from an earlier ``ray.init``; the nodes and drivers share
this one, so Ray's token auth works across them) and its own temp dir. A node may also get a private tmpfs over a
folder (``private``): a node whose local disk the others cannot see, as on a cluster without shared storage.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from core.models import cache_dir

RAY = str(Path(sys.executable).with_name("ray"))
ROOT = Path(__file__).resolve().parents[1]


def namespaces_available() -> str:
    """'' when this process can build network namespaces, else why not."""
    if os.geteuid() != 0:
        return "not root"
    if not shutil.which("ip") or not shutil.which("unshare"):
        return "no iproute2 ip / unshare"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return "" if probe.returncode == 0 else f"ip netns: {probe.stderr.strip()}"


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and r.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r


class Cluster:
    """Ray nodes of ``cpus`` CPUs each (a list: one per node), the first ``start`` of them started (default all; the
    others wait for ``start_node``). ``private``: {node index: folder} mounted as an empty tmpfs for that node only.
    ``dashboard``: the head runs Ray's dashboard and job server at ``dashboard_url`` (``ray job submit``); ``env``:
    on top of every node's and driver's environment. Use as a context manager; ``address``, ``ips``, ``env``."""

    def __init__(self, base: Path, cpus: list[int], start: int | None = None, private: dict[int, Path] | None = None,
                 dashboard: bool = False, env: dict | None = None):
        self.base, self.cpus, self.private, self.dashboard = Path(base), list(cpus), private or {}, dashboard
        self.start = len(self.cpus) if start is None else start
        self.kind = "namespaces" if not namespaces_available() else "cluster_utils"
        k = os.getpid() % 200 + 20  # a subnet of our own: a concurrent run (or a leftover) never shares it
        self.tag, self.subnet = f"hr{k}", f"10.77.{k}"
        self.ips = [f"{self.subnet}.{10 + i}" for i in range(len(cpus))]
        self.ns = [f"{self.tag}n{i}" for i in range(len(cpus))]
        self.procs: dict[int, subprocess.Popen] = {}
        # Ray's temp dirs under a short path of their own: its socket paths must stay under 108 characters, and
        # pytest's base (/tmp/pytest-of-root/pytest-123/cluster0/...) does not leave room for a restarted node's
        self.short = Path(tempfile.mkdtemp(prefix="hrc-", dir="/tmp"))
        home, self.temp = self.base / "home", self.short / "ray"
        home.mkdir(parents=True, exist_ok=True)
        self.temp.mkdir(exist_ok=True)
        self.starts = 0  # node starts so far: a restarted node gets a temp dir of its own (no stale sockets)
        # nothing of this process's distributed or Ray settings (an in-process worker group sets RANK, ...)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k not in
                    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME")}
        # the venv's bin first on PATH, as an activated venv (`ray`, `hybridrl` for a job's entrypoint)
        # HYBRIDRL_CACHE: the machine's cache (the built CPU kernels, converted models), not one in the new HOME --
        # as the nodes of a real cluster keep theirs
        self.env |= {"HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT),
                     "HYBRIDRL_CACHE": str(cache_dir()),
                     "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"} | (env or {})
        self.address = f"{self.ips[0]}:6379"
        self.dashboard_url = f"http://{self.ips[0]}:8265"  # the job server's, with dashboard=True
        self._utils = None

    # ------------------------------------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "Cluster":
        try:
            if self.kind == "namespaces":
                self._network()
                for i in range(self.start):
                    self.start_node(i)
            else:
                self._start_cluster_utils()
        except BaseException:
            self.close()
            raise
        print(f"[multinode] {self.start}-node Ray cluster at {self.address} ({self.kind})", flush=True)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _network(self) -> None:
        self._cleanup_network()  # a leftover of a killed run with this tag
        bridge = f"{self.tag}br"
        _sh("ip", "link", "add", bridge, "type", "bridge")
        _sh("ip", "link", "set", bridge, "up")
        for i, (ns, ip) in enumerate(zip(self.ns, self.ips)):
            host_end, node_end = f"{self.tag}h{i}", f"{self.tag}e{i}"
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", node_end)
            _sh("ip", "link", "set", node_end, "netns", ns)
            _sh("ip", "link", "set", host_end, "master", bridge)
            _sh("ip", "link", "set", host_end, "up")
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ip}/24", "dev", node_end)
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", node_end, "up")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            # names for the nodes' addresses and no nameserver (``ip netns exec`` mounts these over /etc's): the
            # host's DNS is not reachable from a namespace, and every reverse lookup (gloo's, per connection) would
            # wait for it to time out
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
                f"{a} {n}\n" for a, n in zip(self.ips, self.ns)))
            (etc / "resolv.conf").write_text("# no nameserver: names come from hosts\n")

    def start_node(self, i: int, env: dict | None = None, bind: dict[Path, Path] | None = None,
                   timeout_s: float = 60.0) -> None:
        """``ray start`` for node ``i`` in its namespace (the head for 0), with ``env`` on top of the cluster's (its
        workers inherit it) and ``bind`` {path: source}: what that node sees at each path (another checkout at the
        same path, say); wait until the cluster counts it."""
        common = [f"--num-cpus={self.cpus[i]}", "--disable-usage-stats", "--block", f"--node-ip-address={self.ips[i]}"]
        dashboard = [f"--include-dashboard={str(self.dashboard).lower()}"] + (
            [f"--dashboard-host={self.ips[0]}", "--dashboard-port=8265"] if self.dashboard else [])
        # each node its own temp dir, as each machine has its own /tmp: sharing one, a node's runtime-env agent
        # unpacks a job's working_dir over the folder another node's driver runs in
        temp = self.temp if i == 0 else self.short / f"ray{i}-{self.starts}"
        self.starts += 1
        role = ["--head", "--port=6379", *dashboard] if i == 0 else [f"--address={self.address}"]
        role.append(f"--temp-dir={temp}")
        cmd = [RAY, "start", *role, *common]
        mounts = []
        if i in self.private:  # its own empty tmpfs over the folder: that node's local disk
            Path(self.private[i]).mkdir(parents=True, exist_ok=True)
            mounts.append(f'mount -t tmpfs none "{self.private[i]}"')
        mounts += [f'mount --bind "{src}" "{dst}"' for dst, src in (bind or {}).items()]
        if mounts:  # in a mount namespace of its own, so no other node (nor the host) sees them
            cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", " && ".join(mounts) + ' && exec "$0" "$@"',
                   *cmd]
        log = open(self.base / f"node{i}.log", "a")
        self.procs[i] = subprocess.Popen(["ip", "netns", "exec", self.ns[i], *cmd], env=self.env | (env or {}),
                                         start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.wait_for_nodes(len([p for p in self.procs.values() if p.poll() is None]), timeout_s)

    def stop_node(self, i: int) -> None:
        """Node ``i`` lost: its raylet, GCS (the head) and every worker it started, killed at once."""
        p = self.procs.pop(i, None)
        if p is not None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()

    def close(self) -> None:
        for i in list(self.procs):
            self.stop_node(i)
        if self._utils is not None:
            self._utils.shutdown()
            self._utils = None
        if self.kind == "namespaces":
            self._cleanup_network()
        shutil.rmtree(self.short, ignore_errors=True)

    def _cleanup_network(self) -> None:
        for ns in self.ns:
            _sh("ip", "netns", "del", ns, check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        for i in range(len(self.ns)):
            _sh("ip", "link", "del", f"{self.tag}h{i}", check=False)
        _sh("ip", "link", "del", f"{self.tag}br", check=False)

    def _start_cluster_utils(self) -> None:
        """The fallback: nodes of one IP from ``ray.cluster_utils`` (its head in this process's Ray session dir)."""
        from ray.cluster_utils import Cluster as RayCluster

        self._utils = RayCluster(initialize_head=True, head_node_args={"num_cpus": self.cpus[0]})
        for c in self.cpus[1:self.start]:
            self._utils.add_node(num_cpus=c)
        self._utils.wait_for_nodes()
        self.address, self.ips = self._utils.address, ["127.0.0.1"] * len(self.cpus)

    # ------------------------------------------------------------------------------------------------ drivers
    def command(self, args: list[str], node: int = 0) -> list[str]:
        """``args`` as run inside node ``node``'s namespace (as is with the fallback)."""
        return ["ip", "netns", "exec", self.ns[node], *args] if self.kind == "namespaces" else list(args)

    def run(self, args: list[str], node: int = 0, timeout_s: float = 300.0, env: dict | None = None,
            **kw) -> subprocess.CompletedProcess:
        """A driver process on node ``node``, joined to the cluster (RAY_ADDRESS)."""
        return subprocess.run(self.command(args, node), env=self.env | {"RAY_ADDRESS": self.address} | (env or {}),
                              capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, **kw)

    def python(self, code: str, node: int = 0, timeout_s: float = 120.0, env: dict | None = None
               ) -> subprocess.CompletedProcess:
        return self.run([sys.executable, "-c", code], node, timeout_s, env)

    def wait_for_nodes(self, n: int, timeout_s: float = 60.0) -> None:
        probe = (f"import ray; ray.init(address='{self.address}', log_to_driver=False); "
                 "print(sum(1 for x in ray.nodes() if x['Alive']))")
        deadline, r = time.time() + timeout_s, None
        while time.time() < deadline:
            r = self.python(probe, timeout_s=max(5.0, deadline - time.time()))
            if r.returncode == 0 and r.stdout.strip().splitlines()[-1:] == [str(n)]:
                return
            time.sleep(0.5)
        logs = "\n".join(f"node{i}.log:\n{(self.base / f'node{i}.log').read_text()[-1200:]}" for i in self.procs)
        raise RuntimeError(f"the test cluster at {self.address} did not reach {n} node(s) in {timeout_s:.0f}s; the "
                           f"last probe said:\n{(r.stderr if r else '')[-1500:]}\n{logs}")
