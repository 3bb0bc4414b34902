"""Resource pools, worker groups and explicit dispatch: how the single controller drives many processes.

    pool  = ResourcePool(nnodes=1, slots_per_node=2)                 # 2 ranks, one Ray actor each
    group = WorkerGroup(pool, {"actor": RoleSpec(FSDPActor, {"cfg": actor_cfg}),
                               "ref": RoleSpec(FSDPActor, {"cfg": frozen_cfg})})   # colocated
    actor = group.role("actor")
    out   = actor.dp_split(FSDPActor.compute_logprobs, batch)        # split rows across DP ranks, concat back
    stats = actor.call_all(FSDPActor.update, batch)                  # same args on every rank, list of results
    plan  = actor.call_rank0(FSDPActor.bucket_plan)                  # rank 0 only

Dispatch takes the worker *method itself* (``FSDPActor.compute_logprobs``), so jump-to-definition from the
controller lands on the code that runs; the group checks that the method belongs to the role's class. A role with
several engines is called through its interface (``PolicyWorker.compute_logprobs``, core/train/policy.py, whose
docstring names the engines); the method of the role's class that overrides it runs.
``LocalWorkerGroup`` has the same API and runs everything in the driver process (world size 1, no Ray).

Failures: a role raising on any rank surfaces at once as ``WorkerError`` naming role, rank, method and the
remote traceback; a rank whose process dies surfaces as ``WorkerDiedError``; a call that does not finish
within ``timeout_s`` raises ``WorkerTimeoutError``. The driver never waits on the other ranks first.
"""

from __future__ import annotations

import re
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from core.protocol import Batch
from core.worker import RoleSpec, WorkerHost, free_port

DEFAULT_TIMEOUT_S = 1800.0
# what a rank's error says when a collective lost its peer (gloo's sockets, NCCL's communicator)
BROKEN_COLLECTIVE = re.compile(r"gloo|nccl|Connection (closed|reset)|Broken pipe|ProcessGroup", re.IGNORECASE)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours its traceback headers


class WorkerError(RuntimeError):
    """A role method raised on a worker. ``remote_traceback`` is the worker-side traceback."""

    def __init__(self, role: str, rank: int, method: str, detail: str, remote_traceback: str = ""):
        self.role, self.rank, self.method, self.detail, self.remote_traceback = role, rank, method, detail, remote_traceback
        msg = f"role {role!r} rank {rank} failed in {method}: {detail}"
        super().__init__(msg + (f"\n--- remote traceback (rank {rank}) ---\n{remote_traceback}" if remote_traceback else ""))


class WorkerDiedError(WorkerError):
    """The process hosting a rank died (killed, OOM, segfault) during a call."""


class WorkerTimeoutError(WorkerError):
    """A call did not finish in time (a hung collective, a stalled worker)."""


@dataclass(frozen=True)
class ResourcePool:
    """``nnodes`` x ``slots_per_node`` ranks. A slot is ``cpus_per_slot`` CPUs, plus one GPU when device='cuda'."""

    nnodes: int = 1
    slots_per_node: int = 2
    device: str = "cpu"
    cpus_per_slot: float = 1.0

    @property
    def world_size(self) -> int:
        return self.nnodes * self.slots_per_node

    def bundle(self) -> dict[str, float]:
        return {"CPU": self.cpus_per_slot} | ({"GPU": 1.0} if self.device == "cuda" else {})

    def node_bundle(self) -> dict[str, float]:
        """What one of its nodes must hold: ``slots_per_node`` slots."""
        return {k: v * self.slots_per_node for k, v in self.bundle().items()}


def check_capacity(pools: dict[str, ResourcePool], nodes: list[dict]) -> None:
    """Before anything is placed: every pool finds ``nnodes`` distinct alive nodes that can each hold its node bundle,
    and the pools together fit the cluster's totals. ``nodes``: ``ray.nodes()``. Raises naming what each pool asks
    and what Ray sees, node by node."""
    alive = sorted((n for n in nodes if n.get("Alive")), key=lambda n: n["NodeManagerAddress"])

    def holds(node: dict, need: dict[str, float]) -> bool:
        return all(node["Resources"].get(k, 0.0) >= v for k, v in need.items())

    problems = []
    for name, pool in pools.items():
        fit = sum(holds(n, pool.node_bundle()) for n in alive)
        if fit < pool.nnodes:
            problems.append(f"pool {name!r} asks for {pool.nnodes} node(s) x {pool.slots_per_node} slot(s) of "
                            f"{pool.bundle()} (a node must hold {pool.node_bundle()}), but only {fit} node(s) can")
    for key in ("CPU", "GPU"):
        need = sum(p.node_bundle().get(key, 0.0) * p.nnodes for p in pools.values())
        have = sum(n["Resources"].get(key, 0.0) for n in alive)
        if need > have:
            problems.append(f"the pools need {need:g} {key} in all, the cluster has {have:g}")
    if problems:
        def shown(node: dict) -> str:
            held = ", ".join(f"{k} {v:g}" for k, v in sorted(node["Resources"].items()) if k in ("CPU", "GPU"))
            return f"{node['NodeManagerAddress']} ({held})"

        seen = "; ".join(map(shown, alive)) or "none"
        raise RuntimeError("the Ray cluster cannot hold the placement: " + "; ".join(problems)
                           + f". Ray sees {len(alive)} alive node(s): {seen}. Start more nodes (ray start --address="
                           "<head>:6379 on each), or change placement.pools (nnodes, slots_per_node, cpus_per_slot)")


def _method_name(role: str, role_cls: type, method: Callable) -> str:
    """The name to call remotely, after checking that ``method`` is ``role_cls``'s method or that of one of its
    bases (an interface such as ``core.train.policy.PolicyWorker``: the role's own override runs)."""
    name = getattr(method, "__name__", None)
    if name is None or not any(vars(k).get(name) is method for k in role_cls.__mro__):
        raise TypeError(f"{method!r} is not a method of role {role!r} (class {role_cls.__qualname__}); "
                        f"pass the function itself, e.g. {role_cls.__qualname__}.<method>")
    return name


def _merge(results: list[Any], pad: int) -> Any:
    """Concatenate per-DP-rank outputs (Batch or Tensor) and drop padding rows; other outputs stay a list."""
    if all(isinstance(r, Batch) for r in results):
        return Batch.concat(results).unpad(pad)
    if all(isinstance(r, torch.Tensor) for r in results):
        out = torch.cat(results)
        return out[: len(out) - pad]
    if pad:
        raise TypeError(f"dp_split padded the batch by {pad} rows, so outputs must be Batch or Tensor, "
                        f"got {sorted({type(r).__name__ for r in results})}")
    return results


class Pending:
    """Calls started on some ranks: calling it waits for their results; ``ready()`` says, without waiting, whether
    they have all ended."""

    def __init__(self, wait: Callable[[], Any], ready: Callable[[], bool], refs: list | None = None):
        """``refs``: on Ray, each call's result in the object store (another call given them as arguments reads
        them from where they are, not through the driver); None in-process."""
        self._wait, self.ready, self.refs = wait, ready, refs

    def __call__(self) -> Any:
        return self._wait()


class RoleGroup:
    """One role's view of a worker group: the three dispatch modes, for that role's methods."""

    def __init__(self, group: "WorkerGroup | LocalWorkerGroup", name: str, spec: RoleSpec):
        if group.world_size % spec.mp_size:
            raise ValueError(f"role {name!r}: world size {group.world_size} is not a multiple of mp_size {spec.mp_size}")
        self.group, self.name, self.spec = group, name, spec
        self.world_size, self.mp_size = group.world_size, spec.mp_size
        self.dp_size = group.world_size // spec.mp_size

    def call_all(self, method: Callable, *args, timeout_s: float | None = None, **kwargs) -> list[Any]:
        """Every rank runs ``method(*args, **kwargs)``; returns the results in rank order. ``timeout_s`` (not
        passed on) bounds this call instead of the group's limit, e.g. a weight sync that must fail fast."""
        name = _method_name(self.name, self.spec.cls, method)
        ranks = list(range(self.world_size))
        return self.group.run(self.name, name, ranks, [(args, kwargs)] * len(ranks), timeout_s)

    def call_all_async(self, method: Callable, *args, timeout_s: float | None = None, **kwargs) -> Pending:
        """``call_all`` started without waiting (in-process: run now); the ``Pending``'s ``refs`` can be another
        role's call's arguments, so that results travel from rank to rank without the driver."""
        name = _method_name(self.name, self.spec.cls, method)
        ranks = list(range(self.world_size))
        return self.group.submit(self.name, name, ranks, [(args, kwargs)] * len(ranks), timeout_s)

    def call_each(self, method: Callable, per_rank: list[tuple], timeout_s: float | None = None) -> list[Any]:
        """Rank r runs ``method(*per_rank[r])`` (its own arguments: e.g. its part of a checkpoint); results in rank
        order."""
        name = _method_name(self.name, self.spec.cls, method)
        if len(per_rank) != self.world_size:
            raise ValueError(f"role {self.name!r}: {len(per_rank)} argument tuples for {self.world_size} ranks")
        return self.group.run(self.name, name, list(range(self.world_size)), [(a, {}) for a in per_rank], timeout_s)

    def call_rank0(self, method: Callable, *args, timeout_s: float | None = None, **kwargs) -> Any:
        """Only rank 0 runs it (no collectives inside: the other ranks are not called)."""
        name = _method_name(self.name, self.spec.cls, method)
        return self.group.run(self.name, name, [0], [(args, kwargs)], timeout_s)[0]

    def dp_split(self, method: Callable, batch: Batch, *args, **kwargs) -> Any:
        """Split ``batch`` rows into ``dp_size`` equal chunks (padding by repeating rows), run ``method(chunk, ...)``
        on every rank (the ``mp_size`` peers of one DP rank get the same chunk), keep the output of each DP group's
        first rank, and concatenate them back in row order with the padding removed."""
        return self.dp_split_async(method, batch, *args, **kwargs)()

    def dp_split_async(self, method: Callable, batch: Batch, *args, **kwargs) -> "Pending":
        """``dp_split`` started without waiting: returns the function that waits for its result (raising as
        ``dp_split`` would; ``ready()`` asks without waiting). The driver goes on meanwhile; a later call to the same ranks runs after this one
        (Ray runs an actor's calls in the order they were made). In-process (``LocalWorkerGroup``) it runs now."""
        name = _method_name(self.name, self.spec.cls, method)
        padded, pad = batch.pad_to_multiple(self.dp_size)
        chunks = self.group.share(padded.chunk(self.dp_size))
        ranks = list(range(self.world_size))
        calls = [((chunks[r // self.mp_size], *args), kwargs) for r in ranks]
        wait = self.group.submit(self.name, name, ranks, calls)
        return Pending(lambda: _merge(wait()[:: self.mp_size], pad), wait.ready)


# never shipped with a working_dir runtime_env: environments, run outputs, git history (the rest of .gitignore too)
SHIP_EXCLUDES = [".venv", ".venv-vllm", "outputs", ".git", "bench/results", "*.safetensors", "*.gguf", "*.parquet"]


def init_ray(address: str = "", runtime_env: dict | None = None, **kwargs) -> None:
    """``ray.init`` for a run, unless Ray is up already: the cluster at ``address`` (``trainer.ray_address``; empty:
    RAY_ADDRESS if set, else a new local Ray without dashboard), with ``runtime_env`` for every worker (a
    ``working_dir`` ships the driver's checkout to every node; environments and outputs excluded). The workers'
    output reaches the driver's console (warnings included: a sharded-load fallback decides whether a large job
    fits), each line prefixed by Ray with the worker's repr, e.g. ``(main[actor,rollout,ref] rank 1 pid=4242)``."""
    import os

    import ray

    if ray.is_initialized():
        return
    env = dict(runtime_env or {})
    if "working_dir" in env:
        env["excludes"] = SHIP_EXCLUDES + list(env.get("excludes", []))
    # "local": a Ray of this run's own -- ray.init(address=None) would join any cluster `ray start` left on the host
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    if address == "auto":
        check_recorded_cluster()
    local = {"include_dashboard": False} if address == "local" else {}
    ray.init(address=address, runtime_env=env or None, log_to_driver=True, **local, **kwargs)


RAY_CURRENT_CLUSTER = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"  # where `ray start` records it


def check_recorded_cluster(timeout_s: float = 3.0) -> None:
    """``address="auto"`` joins the cluster ``ray start`` recorded on the host; one that is gone (a stale record)
    would have ``ray.init`` retry it without end: refuse at once, naming it and the way out."""
    import socket

    try:
        recorded = RAY_CURRENT_CLUSTER.read_text().strip()
    except OSError:
        return  # nothing recorded: ray.init says so itself, at once
    host, _, port = recorded.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except (OSError, ValueError):
        from core.config.errors import ConfigError

        raise ConfigError(f"trainer.ray_address / RAY_ADDRESS is auto, and the cluster `ray start` recorded in "
                          f"{RAY_CURRENT_CLUSTER} ({recorded}) does not answer: start it (ray start --head), name a "
                          "live one (<head-ip>:6379), or use RAY_ADDRESS=local for a Ray of this run's own",
                          "trainer.ray_address") from None


def check_same_code(group: str, where: list[tuple[int, str, str, str]]) -> None:
    """Every rank imported the driver's ``core`` (``WorkerHost.whereabouts``' digest): a node with another checkout
    or version fails here, named, instead of training with other code."""
    from core.worker import source_digest

    mine = source_digest()
    other = [(rank, ip, host, digest) for rank, (_, ip, host, digest) in enumerate(where) if digest != mine]
    if other:
        rank, ip, host, digest = other[0]
        raise RuntimeError(
            f"worker group {group!r}: rank {rank} on node {ip} ({host}) runs other code than the driver (core/ "
            f"digest {digest}, the driver's {mine}; {len(other)} rank(s) differ). Every node must import the same "
            "version: the same checkout at the same path on every machine, or let Ray ship the driver's with "
            "trainer.runtime_env={working_dir: .} (README, Multi-node)")


class WorkerGroup:
    """One Ray actor (a ``WorkerHost``) per rank of a pool, in one torch.distributed world, hosting ``specs``."""

    def __init__(self, pool: ResourcePool, specs: dict[str, RoleSpec], name: str = "group",
                 timeout_s: float = DEFAULT_TIMEOUT_S, ready_timeout_s: float = 300.0,
                 node_loss_timeout_s: float = 60.0):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not ray.is_initialized():
            raise RuntimeError("WorkerGroup needs Ray: call ray.init() first (or use trainer.backend=local)")
        self.pool, self.specs, self.name, self.timeout_s = pool, dict(specs), name, timeout_s
        self.node_loss_timeout_s = node_loss_timeout_s
        self.world_size = pool.world_size
        self.lost: set[int] = set()  # ranks whose process died and that the run goes on without (core.replicas)
        check_capacity({name: pool}, ray.nodes())
        # one bundle per node holding its slots, each on a node of its own (STRICT_SPREAD): a pool of 2 nodes never
        # lands on one big node, and a node's ranks are local ranks 0.. of that node
        self._pg = placement_group([pool.node_bundle()] * pool.nnodes, strategy="STRICT_SPREAD")
        try:
            ray.get(self._pg.ready(), timeout=ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"worker group {name!r}: pool of {pool.nnodes} node(s) x {pool.slots_per_node} "
                               f"slots of {pool.bundle()} not placed in {ready_timeout_s:.0f}s (each node on a "
                               f"distinct Ray node); free now: {ray.available_resources()}") from None
        threads = max(1, int(pool.cpus_per_slot))
        host_cls = ray.remote(WorkerHost)
        self._hosts = []
        for rank in range(self.world_size):
            node, local_rank = divmod(rank, pool.slots_per_node)
            strategy = PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=node)
            opts = dict(num_cpus=pool.cpus_per_slot, num_gpus=1 if pool.device == "cuda" else 0,
                        scheduling_strategy=strategy, max_restarts=0)
            self._hosts.append(host_cls.options(**opts).remote(rank, self.world_size, local_rank, pool.device, threads,
                                                               f"{name}[{','.join(self.specs)}]", own_process=True))
        ranks, roles, t = list(range(self.world_size)), ",".join(self.specs), ready_timeout_s
        where = self._wait([h.whereabouts.remote() for h in self._hosts], ranks, roles, "WorkerHost.whereabouts", t)
        self.pids, self.node_ips = [w[0] for w in where], [w[1] for w in where]
        check_same_code(name, where)
        addr, port = self._wait([self._hosts[0].address.remote()], [0], roles, "WorkerHost.address", t)[0]
        self._wait([h.setup.remote(addr, port, self.specs, timeout_s) for h in self._hosts], ranks, roles,
                   "WorkerHost.setup", t)

    def config_reads(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> set[str]:
        """The config keys every rank's roles read since they were built (``WorkerHost.config_reads``)."""
        ranks = [r for r in range(self.world_size) if r not in self.lost]
        got = self._wait([self._hosts[r].config_reads.remote() for r in ranks], ranks, ",".join(self.specs),
                         "WorkerHost.config_reads", timeout_s)
        return set().union(*map(set, got))

    def role(self, name: str) -> RoleGroup:
        if name not in self.specs:
            raise KeyError(f"worker group {self.name!r} hosts roles {list(self.specs)}, not {name!r}")
        return RoleGroup(self, name, self.specs[name])

    def share(self, items: list[Any]) -> list[Any]:
        """Put each item in the object store once, so every rank that needs it maps the same bytes."""
        import ray

        return [ray.put(x) for x in items]

    def run(self, role: str, method: str, ranks: list[int], calls: list[tuple[tuple, dict]],
            timeout_s: float | None = None) -> list[Any]:
        return self.submit(role, method, ranks, calls, timeout_s)()

    def submit(self, role: str, method: str, ranks: list[int], calls: list[tuple[tuple, dict]],
               timeout_s: float | None = None) -> Pending:
        """Start the calls; returns the function that waits for their results (the time limit counts from then)."""
        import ray

        refs = [self._hosts[r].execute.remote(role, method, *a, **kw) for r, (a, kw) in zip(ranks, calls)]
        return Pending(lambda: self._wait(refs, ranks, role, f"{self.specs[role].cls.__qualname__}.{method}",
                                          self.timeout_s if timeout_s is None else timeout_s),
                       lambda: not ray.wait(refs, num_returns=len(refs), timeout=0)[1], refs)

    def _wait(self, refs: list, ranks: list[int], role: str, method: str, timeout_s: float) -> list[Any]:
        """Results in order; the first failing rank raises at once, without waiting for its peers."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        pending = dict(zip(refs, ranks))
        deadline = time.monotonic() + timeout_s
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise WorkerTimeoutError(role, min(pending.values()), method,
                                         f"no result after {timeout_s:.0f}s from ranks {sorted(pending.values())}")
            rank = pending.pop(ready[0])
            try:
                ray.get(ready[0])
            except RayTaskError as e:
                # a peer killed mid-collective makes this rank's all-reduce fail too, sometimes before Ray has
                # reported the death: the dead peer is the cause to name, so give the others a moment to show it --
                # longer when the collective itself broke: a whole node lost takes Ray's health checks to declare
                cause = e.cause if getattr(e, "cause", None) is not None else e
                grace = self.node_loss_timeout_s if BROKEN_COLLECTIVE.search(str(cause)) else 3.0
                died = self._first_death(pending, role, method, grace_s=grace)
                if died is not None:
                    raise died from None
                tb = _ANSI.sub("", getattr(e, "traceback_str", "") or str(e))
                node = f" (on node {self.node_ips[rank]})" if hasattr(self, "node_ips") else ""
                raise WorkerError(role, rank, method, f"{type(cause).__name__}: {cause}".splitlines()[0] + node,
                                  tb) from None
            except RayActorError as e:
                raise self._died(role, rank, method, e) from None
            except GetTimeoutError:
                raise WorkerTimeoutError(role, rank, method, "result not retrievable") from None
        return ray.get(refs)

    def _died(self, role: str, rank: int, method: str, e: Exception) -> WorkerDiedError:
        pid = self.pids[rank] if hasattr(self, "pids") else "?"
        node = f" on node {self.node_ips[rank]}" if hasattr(self, "node_ips") else ""
        return WorkerDiedError(role, rank, method, f"worker process (pid {pid}){node} died: "
                               f"{str(e).splitlines()[0] if str(e) else type(e).__name__}")

    def _first_death(self, pending: dict, role: str, method: str, grace_s: float) -> WorkerDiedError | None:
        """The first of the still-pending ranks whose process died within ``grace_s``, if any."""
        import ray
        from ray.exceptions import RayActorError

        deadline = time.monotonic() + grace_s
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            rank = pending.pop(ready[0])
            try:
                ray.get(ready[0])
            except RayActorError as e:
                return self._died(role, rank, method, e)
            except Exception:
                continue
        return None

    def kill(self, rank: int) -> None:
        """End ``rank``'s process (a rollout replica whose engine died: ``core.replicas`` goes on without it)."""
        import ray

        ray.kill(self._hosts[rank], no_restart=True)
        self.lost.add(rank)

    def shutdown(self) -> None:
        """Kill every rank's process and release the pool (safe after a failure, with ranks still hung)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for h in self._hosts:
            ray.kill(h, no_restart=True)
        remove_placement_group(self._pg)
        self._hosts = []


class LocalWorkerGroup:
    """The same API in the driver process: world size 1, no Ray, so ``pdb`` steps straight into role code."""

    def __init__(self, specs: dict[str, RoleSpec], name: str = "local", device: str = "cpu"):
        self.specs, self.name, self.world_size = dict(specs), name, 1
        self._host = WorkerHost(0, 1, 0, device, num_threads=None)
        self._host.setup("127.0.0.1", free_port(), self.specs, DEFAULT_TIMEOUT_S)
        self.pids = [self._host.pid()]

    role = WorkerGroup.role

    def config_reads(self) -> set[str]:
        return set(self._host.config_reads())

    def share(self, items: list[Any]) -> list[Any]:
        return items

    def run(self, role: str, method: str, ranks: list[int], calls: list[tuple[tuple, dict]],
            timeout_s: float | None = None) -> list[Any]:
        out = []  # in-process: a call cannot be abandoned, so there is no timeout
        for rank, (args, kwargs) in zip(ranks, calls):
            try:
                out.append(self._host.execute(role, method, *args, **kwargs))
            except Exception as e:
                raise WorkerError(role, rank, f"{self.specs[role].cls.__qualname__}.{method}",
                                  f"{type(e).__name__}: {e}", traceback.format_exc()) from e
        return out

    def submit(self, role: str, method: str, ranks: list[int], calls: list[tuple[tuple, dict]],
               timeout_s: float | None = None) -> Pending:
        out = self.run(role, method, ranks, calls, timeout_s)  # one process: nothing can run beside the driver
        return Pending(lambda: out, lambda: True)

    def shutdown(self) -> None:
        self._host.shutdown()
