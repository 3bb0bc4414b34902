"""Placement: which roles share a process (colocated) and which get their own pool (split).

A role map in config names a pool for every role; roles naming the same pool are colocated in one
``WorkerGroup`` (one process per rank, shared memory), roles on different pools run in separate groups
with separate torch.distributed worlds:

    placement:
      pools: {main: {nnodes: 1, slots_per_node: 2}}
      roles: {actor: main, rollout: main, ref: main}      # all colocated
"""

from __future__ import annotations

from core.config.schema import PlacementConfig
from core.worker import RoleSpec
from core.worker_group import LocalWorkerGroup, ResourcePool, RoleGroup, WorkerGroup, check_capacity


class Placement:
    """The worker groups of a run, and each role's ``RoleGroup`` handle."""

    def __init__(self, groups: list[WorkerGroup | LocalWorkerGroup], roles: dict[str, RoleGroup]):
        self.groups, self.roles = groups, roles

    def __getitem__(self, role: str) -> RoleGroup:
        return self.roles[role]

    def __contains__(self, role: str) -> bool:
        return role in self.roles

    def where(self) -> str:
        """Which node each pool's ranks run on (Ray groups), one line: ``pool gen (rollout): 10.0.0.1 ranks [0],
        10.0.0.2 ranks [1]``; empty in one process."""
        pools = []
        for g in self.groups:
            ips = getattr(g, "node_ips", None)
            if ips:
                nodes = {ip: [r for r, x in enumerate(ips) if x == ip] for ip in dict.fromkeys(ips)}
                pools.append(f"pool {g.name} ({', '.join(g.specs)}): "
                             + ", ".join(f"{ip} ranks {ranks}" for ip, ranks in nodes.items()))
        return "; ".join(pools)

    def config_reads(self) -> set[str]:
        """The config keys the roles of every group read since they were built (recording stops there)."""
        return set().union(*(g.config_reads() for g in self.groups))

    def shutdown(self) -> None:
        for g in self.groups:
            g.shutdown()


def place(cfg: PlacementConfig, specs: dict[str, RoleSpec], backend: str = "ray",
          timeout_s: float | None = None, node_loss_timeout_s: float = 60.0) -> Placement:
    """Start one worker group per pool that has roles on it (``backend='local'``: one in-process group)."""
    missing = sorted(set(specs) - set(cfg.roles))
    if missing:
        raise KeyError(f"placement.roles has no pool for role(s) {missing}; it maps {dict(cfg.roles)}")
    if backend == "local":
        group = LocalWorkerGroup(specs)
        return Placement([group], {name: group.role(name) for name in specs})
    if backend != "ray":
        raise ValueError(f"trainer.backend must be 'ray' or 'local', got {backend!r}")
    import ray

    used = {p: c for p, c in cfg.pools.items() if any(cfg.roles[name] == p for name in specs)}
    pools = {p: ResourcePool(c.nnodes, c.slots_per_node, c.device, c.cpus_per_slot) for p, c in used.items()}
    check_capacity(pools, ray.nodes())  # every pool at once, before any is placed
    groups, roles = [], {}
    try:
        for pool_name, pool in pools.items():
            hosted = {name: spec for name, spec in specs.items() if cfg.roles[name] == pool_name}
            kw = {"node_loss_timeout_s": node_loss_timeout_s} | ({} if timeout_s is None else {"timeout_s": timeout_s})
            group = WorkerGroup(pool, hosted, name=pool_name, **kw)
            groups.append(group)
            roles |= {name: group.role(name) for name in hosted}
    except BaseException:  # a later pool that cannot start releases the earlier ones
        for g in groups:
            g.shutdown()
        raise
    return Placement(groups, roles)
