"""Typed, frozen config: a YAML/Hydra tree is validated once into these dataclasses and never mutated.

Sections grow with the features that read them; every field has its meaning in a comment above it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PoolConfig:
    # machines in this pool
    nnodes: int = 1
    # ranks (processes) per machine; with device=cuda, one GPU each
    slots_per_node: int = 2
    # cpu (gloo) or cuda (nccl)
    device: str = "cpu"
    # CPUs reserved per rank; also its torch thread count
    cpus_per_slot: float = 1.0

    def __post_init__(self):
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"pool device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.nnodes < 1 or self.slots_per_node < 1:
            raise ValueError(f"pool needs nnodes >= 1 and slots_per_node >= 1, got {self.nnodes}, {self.slots_per_node}")


@dataclass(frozen=True)
class PlacementConfig:
    # named resource pools
    pools: dict[str, PoolConfig] = field(default_factory=lambda: {"main": PoolConfig()})
    # role -> pool; roles on the same pool are colocated in one process per rank
    roles: dict[str, str] = field(default_factory=lambda: {"actor": "main", "rollout": "main", "ref": "main"})

    def __post_init__(self):
        unknown = {r: p for r, p in self.roles.items() if p not in self.pools}
        if unknown:
            raise ValueError(f"placement.roles names unknown pool(s) {unknown}; pools are {list(self.pools)}")


@dataclass(frozen=True)
class TrainerConfig:
    # ray: worker groups on Ray; local: everything in this process (world size 1, for pdb)
    backend: str = "ray"
    # RL steps to run
    total_steps: int = 10
    # where config.json and metrics.jsonl (and later checkpoints) go
    output_dir: str = "outputs/run"
    # seed of the prompt order
    seed: int = 0
    # seconds a worker call may take before the driver raises WorkerTimeoutError
    call_timeout_s: float = 1800.0
    # score data.val_files every N steps (0 = only before the first and after the last step)
    val_every: int = 0

    def __post_init__(self):
        if self.backend not in ("ray", "local"):
            raise ValueError(f"trainer.backend must be 'ray' or 'local', got {self.backend!r}")
