"""A real SLURM cluster on one host, for tests: ``munged`` (a key, socket and state of its own), ``slurmctld`` on
the host, and two ``slurmd`` (nodeA, nodeB), each in a network namespace of its own (its own IP on a bridge,
``tests/multinode.py``'s network), a UTS namespace with its own hostname and a PID namespace of its own (``ray stop``
in a job sees that node's processes only, as on a machine of its own; killing the node's first process ends every job
process on it). Each node resolves nodeA / nodeB through its namespace's /etc/hosts (``ip netns exec`` binds
/etc/netns/<ns>/hosts there); the host's /etc/hosts is not touched -- slurmctld reaches the nodes by NodeAddr and the
nodes reach it at the bridge's host-side IP (SlurmctldHost=<hostname>(<that IP>)).

Every client command gets the generated slurm.conf through ``SLURM_CONF`` (``SlurmCluster.env``). Needs root,
iproute2, unshare and Debian's slurm-wlm + munge; ``unavailable()`` says why not (the tests skip saying it).
Teardown always runs: the nodes' PID namespaces killed, slurmctld and munged stopped, namespaces, links, bridge and
/etc/netns entries removed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.multinode import Cluster, _sh, namespaces_available

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "sinfo", "squeue", "scontrol", "scancel")
NODES = ("nodeA", "nodeB")
HOST = socket.gethostname().split(".")[0]  # slurmctld runs where SlurmctldHost's name is this host's


def unavailable() -> str:
    """'' when a SLURM cluster of namespaces can be built here, else why not."""
    why = namespaces_available()
    if why:
        return f"network namespaces: {why}"
    missing = [d for d in DAEMONS if not shutil.which(d)]
    return f"not installed: {' '.join(missing)} (apt-get install slurm-wlm munge)" if missing else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class _Net(Cluster):
    """tests/multinode.py's namespaces and bridge, on a tag and subnet of their own (a multinode cluster of this
    process, or another run's, never shares them); no Ray is started (``start=0``)."""

    def __init__(self, base: Path, n: int):
        super().__init__(base, cpus=[1] * n, start=0)
        k = os.getpid() % 200 + 20
        self.tag, self.subnet = f"hs{k}", f"10.78.{k}"
        self.ips = [f"{self.subnet}.{10 + i}" for i in range(n)]
        self.ns = [f"{self.tag}n{i}" for i in range(n)]
        self.host_ip = f"{self.subnet}.1"

    def network(self) -> None:
        self._network()
        _sh("ip", "addr", "add", f"{self.host_ip}/24", "dev", f"{self.tag}br")


class SlurmCluster:
    """Use as a context manager: ``env`` (SLURM_CONF, and the Ray-free HOME of the multinode helper) for client
    commands, ``run(*args)`` for one, ``nodes`` {name: IP}, ``conf`` the slurm.conf. ``cpus`` per node."""

    def __init__(self, base: Path, cpus: int = 1):
        self.base, self.cpus = Path(base), cpus
        self.base.mkdir(parents=True, exist_ok=True)
        self.net = _Net(self.base, len(NODES))
        self.nodes = dict(zip(NODES, self.net.ips))
        self.conf = self.base / "slurm.conf"
        self.procs: dict[str, subprocess.Popen] = {}
        # a short folder of /tmp: munged's socket (munged wants every folder above it searchable by all: not the
        # 0700 of pytest's tmp dirs) and the jobs' Ray temp dir (Ray's socket paths must stay under 108 characters;
        # its own, so no `ray start` here lands in /tmp/ray, where another Ray on the host would find it)
        self.scratch = Path(tempfile.mkdtemp(prefix="hrs-", dir="/tmp"))
        self.scratch.chmod(0o755)
        self.munge_socket = self.scratch / "munge" / "munge.socket.2"
        self.ray_tmp = self.scratch / "ray"
        self.ray_tmp.mkdir()
        self.env = self.net.env | {"SLURM_CONF": str(self.conf), "RAY_TMPDIR": str(self.ray_tmp)}
        self.env = {k: v for k, v in self.env.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))
                    or k == "SLURM_CONF"}

    # ------------------------------------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "SlurmCluster":
        try:
            self.net.network()
            self._munge()
            self._write_conf()
            self._start("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
            for name, ns in zip(NODES, self.net.ns):
                self._node(name, ns)
            self.wait_idle()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self, name: str, cmd: list[str]) -> None:
        log = open(self.base / f"{name}.out", "a")
        self.procs[name] = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        log.close()

    def _munge(self) -> None:
        d = self.munge_socket.parent
        d.mkdir(exist_ok=True)
        d.chmod(0o755)  # munged: the socket's folder must be searchable by all, not writable by them
        key = d / "munge.key"
        _sh("mungekey", "-c", "-f", "-k", str(key))
        key.chmod(0o600)
        self._start("munged", ["munged", "-F", f"--socket={self.munge_socket}", f"--key-file={key}",
                               f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}",
                               f"--seed-file={d / 'munged.seed'}"])
        deadline = time.time() + 20
        while not self.munge_socket.exists():
            if self.procs["munged"].poll() is not None or time.time() > deadline:
                raise RuntimeError(f"munged did not start: {(self.base / 'munged.out').read_text()[-1500:]}")
            time.sleep(0.1)

    def _write_conf(self) -> None:
        b = self.base
        for d in ("state", "spool", *(f"spool/{n}" for n in NODES)):
            (b / d).mkdir(exist_ok=True)
        (b / "plugstack.conf").write_text("")  # not the system's /etc/slurm/plugstack.conf
        nodes = "\n".join(f"NodeName={n} NodeAddr={ip} CPUs={self.cpus} State=UNKNOWN" for n, ip in self.nodes.items())
        self.conf.write_text(f"""\
ClusterName=hrtest
SlurmctldHost={HOST}({self.net.host_ip})
SlurmctldPort={_free_port()}
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket},cred_expire=10
SchedulerParameters=sched_interval=5,bf_interval=5
SlurmUser=root
SlurmdUser=root
StateSaveLocation={b / 'state'}
SlurmdSpoolDir={b / 'spool'}/%n
SlurmctldPidFile={b / 'slurmctld.pid'}
SlurmdPidFile={b / 'spool'}/slurmd-%n.pid
SlurmctldLogFile={b / 'slurmctld.log'}
SlurmdLogFile={b}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={b / 'plugstack.conf'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
MailProg=/bin/true
ReturnToService=2
KillWait=30
MinJobAge=600
{nodes}
PartitionName=cpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

    def _node(self, name: str, ns: str) -> None:
        # the node's /etc/hosts (ip netns exec binds /etc/netns/<ns>/* over /etc): its own name and the others'
        etc = Path("/etc/netns") / ns
        etc.mkdir(parents=True, exist_ok=True)
        hosts = "".join(f"{ip} {n}\n" for n, ip in self.nodes.items())
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{self.net.host_ip} {HOST}\n{hosts}")
        # a UTS namespace (hostname nodeA), a PID namespace (sh is its init: it reaps the orphans slurmd leaves);
        # --kill-child: a SIGKILL to this unshare ends the namespace, every job process on the node with it. slurmd
        # 22.05 loads a cgroup plugin whatever the config, and ip netns exec mounts a sysfs of the namespace's own,
        # without /sys/fs/cgroup: a tmpfs there with an empty named hierarchy at systemd/ is what its cgroup v1
        # plugin checks for (no controller: proctrack/linuxproc and task/none use none)
        cgroup = ("mount -t tmpfs cgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/systemd && "
                  "mount -t cgroup -o none,name=hrslurm cgroup /sys/fs/cgroup/systemd")
        self._start(name, ["ip", "netns", "exec", ns, "unshare", "--uts", "--pid", "--fork", "--mount-proc",
                           "--kill-child", "sh", "-c", f'hostname {name} && {cgroup} && "$0" "$@"',
                           "slurmd", "-D", "-N", name, "-f", str(self.conf)])

    def close(self) -> None:
        for name in reversed(list(self.procs)):
            p = self.procs.pop(name)
            if name in NODES or p.poll() is not None:  # a node: its PID namespace goes at once, jobs included
                sig = signal.SIGKILL
            else:
                sig = signal.SIGTERM
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.net.close()
        for ns in self.net.ns:
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        try:
            Path("/etc/netns").rmdir()  # made for these nodes (ip netns makes none): gone when empty
        except OSError:
            pass
        shutil.rmtree(self.scratch, ignore_errors=True)

    # ------------------------------------------------------------------------------------------------ clients
    def run(self, *args: str, check: bool = True, timeout_s: float = 60.0, cwd: Path | None = None
            ) -> subprocess.CompletedProcess:
        r = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout_s, cwd=cwd)
        if check and r.returncode:
            raise RuntimeError(f"{' '.join(args)} -> {r.returncode}: {r.stderr.strip()}\n{self.logs()}")
        return r

    def logs(self, chars: int = 1500) -> str:
        out = []
        for p in [self.base / "slurmctld.log", *(self.base / f"slurmd-{n}.log" for n in NODES),
                  *(self.base / f"{n}.out" for n in self.procs)]:
            if p.exists() and p.stat().st_size:
                out.append(f"--- {p.name}:\n{p.read_text(errors='replace')[-chars:]}")
        return "\n".join(out)

    def wait_idle(self, timeout_s: float = 60.0) -> str:
        """Until sinfo shows every node idle; its output."""
        deadline, out = time.time() + timeout_s, ""
        while time.time() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited ({p.returncode}):\n{self.logs()}")
            r = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
            out = r.stdout + r.stderr
            states = dict(line.split() for line in r.stdout.splitlines() if len(line.split()) == 2)
            if r.returncode == 0 and all(states.get(n) == "idle" for n in NODES):
                return out
            time.sleep(0.5)
        raise RuntimeError(f"the SLURM nodes are not idle after {timeout_s:.0f}s; sinfo said:\n{out}\n{self.logs()}")

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as {key: value} (the first value of a key)."""
        r = self.run("scontrol", "show", "job", "-o", job_id)
        fields: dict[str, str] = {}
        for m in re.finditer(r"(\w+(?:/\w+)?)=(\S*)", r.stdout):
            fields.setdefault(m.group(1), m.group(2))
        return fields

    def wait_job(self, job_id: str, states: tuple[str, ...] = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                                                "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"),
                 timeout_s: float = 300.0, every_s: float = 1.0, seen: list | None = None) -> dict[str, str]:
        """Poll ``scontrol show job`` until JobState is one of ``states``; the job's fields. ``seen``: each new
        (JobState, Restarts) appended as it shows."""
        deadline = time.time() + timeout_s
        while True:
            j = self.job(job_id)
            if seen is not None and (not seen or seen[-1] != (j.get("JobState"), j.get("Restarts"))):
                seen.append((j.get("JobState"), j.get("Restarts")))
            if j.get("JobState") in states:
                return j
            if time.time() > deadline:
                raise TimeoutError(f"job {job_id} still {j.get('JobState')} ({j.get('Reason')}) after "
                                   f"{timeout_s:.0f}s\n{self.logs()}")
            time.sleep(every_s)
