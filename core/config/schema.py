"""Typed, frozen config: a YAML/Hydra tree is validated once into these dataclasses and never mutated.

Sections grow with the features that read them; every field has its meaning in a comment above it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from core.config.ranges import Count, NonNegative, PositiveFloat, PositiveInt, check_fields


@dataclass(frozen=True)
class PoolConfig:
    # machines in this pool
    nnodes: PositiveInt = 1
    # ranks (processes) per machine; with device=cuda, one GPU each
    slots_per_node: PositiveInt = 2
    # cpu (gloo) or cuda (nccl)
    device: Literal["cpu", "cuda"] = "cpu"
    # CPUs reserved per rank; also its torch thread count
    cpus_per_slot: PositiveFloat = 1.0
    # memory of one GPU and of one machine, GB: the capacity planner's budget (`--dry-run`); 0 = not stated
    # (the planner then asks the host it runs on)
    gpu_memory_gb: NonNegative = 0.0
    host_memory_gb: NonNegative = 0.0

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class PlacementConfig:
    # named resource pools
    pools: dict[str, PoolConfig] = field(default_factory=lambda: {"main": PoolConfig()})
    # role -> pool; roles on the same pool are colocated in one process per rank
    roles: dict[str, str] = field(default_factory=lambda: {"actor": "main", "rollout": "main", "ref": "main",
                                                          "teacher": "main"})

    def __post_init__(self):
        check_fields(self)
        # a map naming some roles (placement.roles.rollout=gen on the command line) leaves the others where the
        # default map puts them, or with the actor where that pool is not there
        default = type(self).__dataclass_fields__["roles"].default_factory()
        missing = {r: p for r, p in default.items() if r not in self.roles}
        if missing:
            if "actor" in missing and missing["actor"] not in self.pools:
                raise ValueError(f"placement.roles names no pool for the actor (and {missing['actor']!r} is not a "
                                 f"pool); add placement.roles.actor=<one of {list(self.pools)}>")
            actor = self.roles.get("actor", missing.get("actor"))
            object.__setattr__(self, "roles", {**{r: p if p in self.pools else actor for r, p in missing.items()},
                                               **self.roles})
        unknown = {r: p for r, p in self.roles.items() if p not in self.pools}
        if unknown:
            raise ValueError(f"placement.roles names unknown pool(s) {unknown}; pools are {list(self.pools)}")


@dataclass(frozen=True)
class AsyncConfig:
    # sync: generate, then train on it. one_step_off: generate step k+1's samples while step k updates the actor
    # (core/one_step_off.py), one update stale. streaming: the rollout generates continuously into a buffer of
    # finished groups, takes weight updates between decode steps (in-flight sequences go on under the new
    # weights) and the trainer takes a batch as soon as one is ready (core/streaming.py). Both need the rollout
    # on a pool of its own to overlap; both correct the staleness by algo.off_policy_correction
    mode: Literal["sync", "one_step_off", "streaming"] = "sync"
    # one_step_off, false: the same loop with each generation started after the sync -- nothing stale, the
    # synchronous run's metrics exactly (to tell whether a divergence comes from the staleness)
    overlap: bool = True
    # algo.tis_cap in one_step_off and streaming runs that leave it at 0 (set this to 0 for none)
    tis_cap: NonNegative = 2.0
    # streaming: the most weight versions a sample's oldest token may lag the policy that trains on it; 0 = the
    # synchronous run exactly (nothing is generated ahead)
    max_staleness: Count = 1
    # streaming: a group over max_staleness is dropped (counted: rollout/stale_dropped), or the trainer waits for
    # the groups whose bound ends at this step (none is ever dropped; the long tail holds the step as in sync)
    on_stale: Literal["drop", "wait"] = "drop"
    # streaming: what the sequences in flight attend to after a weight update. recompute: their KV is computed again
    # with the new weights (a prefill of every sequence in flight per update), so each token is exactly what its
    # version samples on the whole prefix; keep: the KV the earlier versions wrote stays (no prefill; the later
    # tokens are drawn by the new weights over keys and values of the old -- rollout_logprobs are still what was
    # sampled, and the off-policy correction weighs them)
    partial_kv: Literal["recompute", "keep"] = "recompute"
    # streaming: decode steps per call to the rollout ranks (between two calls a weight update can land)
    chunk_steps: PositiveInt = 8
    # streaming: decode steps the rollout runs during each trainer phase (old log-probs, reference, update); 0 = as
    # many as the phase's time allows (fastest; the split of each sample between versions then depends on timing).
    # A fixed number makes a run repeat exactly under the same seeds (and resume as the uninterrupted run would)
    overlap_steps: Count = 0

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class TrainerConfig:
    # ray: worker groups on Ray; local: everything in this process (world size 1, for pdb)
    backend: Literal["ray", "local"] = "ray"
    # RL steps to run
    total_steps: Count = 10
    # > 0: passes over the training data instead; total_steps becomes epochs x floor(rows / data.prompts_per_step),
    # counted once the data is loaded (verl's total_epochs, its dataloader dropping the last partial batch)
    total_epochs: Count = 0
    # where config.json and metrics.jsonl (and later checkpoints) go
    output_dir: str = "outputs/run"
    # seed of the prompt order
    seed: int = 0
    # seconds a worker call may take before the driver raises WorkerTimeoutError
    call_timeout_s: PositiveFloat = 1800.0
    # score data.val_files every N steps (0 = only before the first and after the last step)
    test_freq: Count = 0
    # held-out samples written to <output_dir>/val_generations.jsonl at each validation (question, the whole
    # response with tool answers and turn markers, score): read what the policy does (0 = none)
    log_val_generations: Count = 4
    # steps at the start that train only the critic (the policy waits for useful values)
    critic_warmup: Count = 0
    # checkpoint every N steps and after the last (0 = never): actor + optimizer + RNG per rank + data position
    save_freq: Count = 0
    # checkpoints kept (the newest; 0 = all)
    save_keep: Count = 2
    # auto: resume from <output_dir>/checkpoints/latest when there is one; disable: start fresh; or a checkpoint path
    resume_mode: str = "auto"
    # experiment trackers (core/tracking.py): console, jsonl (metrics.jsonl is always written), tensorboard,
    # swanlab, wandb
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    # tracker project and run names (empty run name: the output folder's name)
    project_name: str = "hybridrl"
    experiment_name: str = ""
    # offline: trackers write under output_dir only; online: swanlab / wandb upload (their own login)
    tracker_mode: Literal["offline", "online"] = "offline"
    # stop the run after this many consecutive steps whose actor gradient norm was inf/nan (their optimizer steps
    # are skipped and counted in actor/nonfinite_grad_frac); 0 = never stop
    max_nonfinite_grad_steps: Count = 3
    # the cluster's shape under verl's names, for a config to interpolate into its pools
    # (placement.pools.main.nnodes: ${trainer.nnodes}); 0 = not used
    nnodes: Count = 0
    n_gpus_per_node: Count = 0
    # one-step-off-policy async training (YAML key: async)
    async_: AsyncConfig = field(default_factory=AsyncConfig)
    # the Ray cluster to join: "" = RAY_ADDRESS if set, else a new local Ray; "auto" = the cluster started on the
    # machine (ray start); or <head-ip>:6379 (the driver runs on a node of that cluster)
    ray_address: str = ""
    # Ray's runtime_env for every worker, e.g. {working_dir: ., excludes: [outputs]}: Ray ships the driver's checkout
    # to every node (a cluster without a shared checkout; README, Multi-node); empty = the nodes' own files
    runtime_env: dict = field(default_factory=dict)
    # SIGTERM / SIGUSR1 (a scheduler's warning before it kills the job): the step in progress may take this long to
    # finish before the run checkpoints and exits 75; a step still running then is abandoned (core/preemption.py).
    # Under SLURM keep it below KillWait (30 s by default)
    preempt_deadline_s: PositiveFloat = 20.0
    # after a collective breaks (a peer gone), wait up to this long for Ray to name the lost worker or node before
    # reporting the broken call itself
    node_loss_timeout_s: PositiveFloat = 60.0
    # repeat the run bit for bit on the same machine kind: deterministic kernels in every worker, configurations
    # whose numbers depend on timing refused, and the actor's weights hashed after every step (actor/weights_sha256;
    # one full gather a step) so two runs compare step by step (core/determinism.py)
    deterministic: bool = False

    def __post_init__(self):
        check_fields(self)
