"""One process per rank: it initialises torch.distributed and hosts the roles placed on it.

Roles (actor, rollout, reference, critic, ...) are plain classes built as ``cls(ctx, **kwargs)``. Roles that
share a resource pool are *colocated*: they live in the same ``WorkerHost`` process, see each other through
``ctx.colocated`` and share its memory (the rollout engine reads the actor's weights without a copy).

``WorkerHost`` runs inside a Ray actor (``core.worker_group.WorkerGroup``) or directly in the driver
(``LocalWorkerGroup``, world size 1, for stepping through with pdb).
"""

from __future__ import annotations

import gc
import os
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from core import determinism
from core.config import reads
from core.memory import keep_freed_memory
from core.preemption import ignore_sigterm_in_worker


@dataclass(frozen=True)
class RoleSpec:
    """How to build one role on every rank of its pool.

    ``mp_size``: ranks that share one data shard (tensor/sequence-parallel peers, consecutive ranks).
    ``dp_split`` gives each such group one chunk and keeps the output of its first rank only.
    """

    cls: type
    kwargs: dict[str, Any] = field(default_factory=dict)
    mp_size: int = 1


@dataclass
class WorkerContext:
    """What a role knows about where it runs."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    # the role objects hosted by this same process, by role name (filled once all are built)
    colocated: dict[str, Any] = field(default_factory=dict)

    def dp_rank(self, mp_size: int) -> int:
        return self.rank // mp_size


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # no Ray: the local host
        return "127.0.0.1"


def interface_of(ip: str) -> str | None:
    """The network interface of the host that carries ``ip`` (None: none does)."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addrs):
            return name
    return None


def bind_collectives_to(ip: str, cuda: bool) -> str | None:
    """Make gloo (and NCCL's sockets on GPU) use the interface that carries this node's Ray IP. Left to itself, gloo
    advertises the address its hostname resolves to -- loopback on many nodes -- and ranks on other nodes never
    reach it ("Gloo connectFullMesh failed ... Connection refused, remote=[127.0.0.1]"). A GLOO_SOCKET_IFNAME /
    NCCL_SOCKET_IFNAME already set (by the user, for every node) wins. Returns the interface chosen."""
    iface = interface_of(ip)
    if iface is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)
        if cuda:
            os.environ.setdefault("NCCL_SOCKET_IFNAME", iface)
    return iface


def leave_process_group() -> None:
    """Destroy this process's torch.distributed groups, after collecting the garbage cycles that still hold FSDP2
    modules (hooks and states refer back to their modules; 42 of a tiny model's survive ``train`` returning).
    Left to the interpreter's exit, they and the device mesh (with it the gloo group) are freed while Python shuts
    down, and a rank whose work is done can abort there: "terminate called without an active exception" (SIGABRT,
    now and then, rank 1 of ``tests/test_rm_train.py``'s torchrun pair)."""
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


def source_digest() -> str:
    """A hash of this process's ``core`` package (its .py files and C++ sources, by path and content): the code a
    worker runs. The driver compares every rank's with its own (``core.worker_group``)."""
    import hashlib
    from pathlib import Path

    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".cpp", ".h") and "__pycache__" not in p.parts):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _quiet_progress_bars() -> None:
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass


class WorkerHost:
    """Hosts the roles of one rank. All methods are called by the worker group, never by users."""

    def __init__(self, rank: int, world_size: int, local_rank: int, device: str, num_threads: int | None,
                 label: str = "worker", own_process: bool = False):
        self.rank, self.world_size, self.local_rank, self.label = rank, world_size, local_rank, label
        if own_process:  # a Ray worker: a scheduler's SIGTERM is the driver's to act on (core.preemption)
            ignore_sigterm_in_worker()
        _quiet_progress_bars()  # their output reaches the driver: keep warnings, drop each rank's loading bars
        determinism.enable_if_asked()  # trainer.deterministic: its environment came with the process
        if num_threads:
            torch.set_num_threads(num_threads)
        if device == "cuda":
            # Ray gives each GPU actor only its own device (CUDA_VISIBLE_DEVICES), which is then index 0
            index = 0 if torch.cuda.device_count() == 1 else local_rank
            torch.cuda.set_device(index)
            self.device = torch.device("cuda", index)
        else:
            self.device = torch.device("cpu")
            keep_freed_memory()  # big temporaries reuse heap pages instead of faulting in fresh ones every step
        self.roles: dict[str, Any] = {}

    def __repr__(self) -> str:
        # Ray prefixes every line this process prints or logs with its actor's repr: "(group[actor,ref] rank 1 ...)"
        return f"{self.label} rank {self.rank}"

    def address(self) -> tuple[str, int]:
        """Rank 0 hands out the rendezvous address: this node's IP and a free port on it."""
        return node_ip(), free_port()

    def pid(self) -> int:
        return os.getpid()

    def whereabouts(self) -> tuple[int, str, str, str]:
        """(pid, node IP, host name, digest of the ``core`` code this process imported), for the driver's checks and
        for naming a lost rank's node."""
        return os.getpid(), node_ip(), socket.gethostname(), source_digest()

    def setup(self, master_addr: str, master_port: int, specs: dict[str, RoleSpec], timeout_s: float) -> None:
        """Join the group's torch.distributed world, then build every hosted role."""
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(self.local_rank))
        bind_collectives_to(node_ip(), self.device.type == "cuda")
        if not dist.is_initialized():
            # on GPU, gloo serves collectives on host tensors too (FSDP2 CPU offload: grad-norm, full_tensor)
            backend = "cpu:gloo,cuda:nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, rank=self.rank, world_size=self.world_size,
                                    timeout=timedelta(seconds=timeout_s),
                                    device_id=self.device if self.device.type == "cuda" else None)
        ctx = WorkerContext(self.rank, self.world_size, self.local_rank, self.device)
        reads.start([spec.kwargs for spec in specs.values()])  # which config keys the roles read (config_reads)
        for name, spec in specs.items():
            self.roles[name] = spec.cls(ctx, **spec.kwargs)
        ctx.colocated.update(self.roles)

    def execute(self, role: str, method: str, /, *args, **kwargs) -> Any:
        """Run ``role.method(*args, **kwargs)``; the group checked on the driver that the method exists.
        Args travel unpacked so Ray resolves object-store refs among them (zero-copy) before the call."""
        fn: Callable = getattr(self.roles[role], method)
        return fn(*args, **kwargs)

    def config_reads(self) -> list[str]:
        """The config keys this process's roles read since they were built (``core.config.reads``); reading stops
        being recorded."""
        return sorted(reads.stop())

    def shutdown(self) -> None:
        self.roles.clear()
        leave_process_group()
