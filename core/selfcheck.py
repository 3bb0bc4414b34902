"""``hybridrl selfcheck``: start the roles on their pools and prove the runtime works on the host/cluster.

It places actor, rollout and reference as the config says (colocated by default), then checks each claim the
trainer relies on: one process per rank, colocated roles share it, an all-reduce sums over the group, a batch
split across data-parallel ranks comes back whole and in order. Prints a table; exits non-zero on a mismatch.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from core.config import PlacementConfig
from core.placement import place
from core.protocol import Batch
from core.worker import RoleSpec, WorkerContext


class Probe:
    """A role that only reports where it runs."""

    def __init__(self, ctx: WorkerContext):
        self.ctx = ctx

    def where(self) -> tuple[int, int, str]:
        return self.ctx.rank, os.getpid(), str(self.ctx.device)

    def allreduce_ones(self) -> float:
        t = torch.ones(1, device=self.ctx.device)
        dist.all_reduce(t)
        return t.item()

    def add_rank(self, batch: Batch) -> Batch:
        return Batch({"y": batch["x"] + 0, "rank": torch.full((len(batch),), self.ctx.rank)})


def selfcheck(cfg: PlacementConfig, backend: str, rows: int = 1 << 16, width: int = 64) -> bool:
    t0 = time.perf_counter()
    placement = place(cfg, {role: RoleSpec(Probe) for role in cfg.roles}, backend)
    print(f"placed roles {dict(cfg.roles)} with backend={backend} in {time.perf_counter() - t0:.1f}s")
    ok = True
    try:
        print(f"{'role':<10}{'rank':>5}{'pid':>9}  device")
        for role, group in placement.roles.items():
            for rank, pid, device in group.call_all(Probe.where):
                print(f"{role:<10}{rank:>5}{pid:>9}  {device}")
            sums = group.call_all(Probe.allreduce_ones)
            good = sums == [float(group.world_size)] * group.world_size
            ok &= good
            print(f"  all-reduce of ones over {group.world_size} rank(s): {sums} {'ok' if good else 'WRONG'}")
        batch = Batch({"x": torch.randn(rows, width)})
        first = next(iter(placement.roles.values()))
        t = time.perf_counter()
        out = first.dp_split(Probe.add_rank, batch)
        dt = time.perf_counter() - t
        same = torch.equal(out["y"], batch["x"])
        ok &= same
        print(f"  dp_split of {batch.nbytes() / 2**20:.0f} MB over {first.dp_size} rank(s) and back: "
              f"{dt * 1e3:.0f} ms, {'identical' if same else 'CHANGED'}")
    finally:
        placement.shutdown()
    print("selfcheck", "passed" if ok else "FAILED")
    return ok
