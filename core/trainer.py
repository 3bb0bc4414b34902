"""``fit(cfg)``: place the roles, stream prompts, run ``core.loop.step`` for ``total_steps``, log every step.

Every step appends one JSON line to ``<output_dir>/metrics.jsonl``; the console gets a progress bar and a
one-line summary per step. At start it prints the effective batch sizes in their units -- the most asked
question about verl's config; at the end, ``core.report``'s summary and ``<output_dir>/curves.png``.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

from core.config.schema import PlacementConfig, TrainerConfig
from core.engines.fsdp import ActorConfig, FSDPActor
from core.loop import Roles, StepConfig, prompts_from_rows, step, validate
from core.report import report
from core.roles import RolloutConfig, RolloutWorker
from core.worker import RoleSpec


@dataclass(frozen=True)
class DataConfig:
    # verl-schema parquet files to train on
    train_files: list[str] = field(default_factory=list)
    # prompts per RL step (each sampled n times)
    prompts_per_step: int = 8
    # shuffle the prompts each epoch (seeded by trainer.seed)
    shuffle: bool = True
    # use only the first N rows (0 = all)
    limit: int = 0
    # held-out verl-schema parquet scored greedily before training, every trainer.val_every steps and at the end
    val_files: list[str] = field(default_factory=list)
    # use only the first N held-out rows (0 = all)
    val_limit: int = 0


@dataclass(frozen=True)
class RewardConfig:
    # a Python file with a custom reward function (empty: the built-in registry keyed by data_source)
    path: str = ""
    # the function's name in that file
    name: str = "compute_score"


@dataclass(frozen=True)
class RunConfig:
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    # a frozen reference policy (for the KL loss); off when actor.kl_loss_coef is 0 and this is false
    use_ref: bool = True
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: StepConfig = field(default_factory=StepConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)


def effective_sizes(cfg: RunConfig, dp_size: int) -> str:
    """The batch-size arithmetic in words, printed at start."""
    n, prompts = cfg.algo.sampling.n, cfg.data.prompts_per_step
    samples = prompts * n
    mini = cfg.actor.ppo_mini_batch_size
    if samples % mini:
        raise ValueError(f"samples per step ({prompts} prompts x n={n} = {samples}) must be a multiple of "
                         f"actor.ppo_mini_batch_size={mini}")
    per_rank = mini // dp_size
    micro = (f"up to {cfg.actor.max_tokens_per_micro} tokens" if cfg.actor.max_tokens_per_micro > 0
             else f"{cfg.actor.micro_batch_size} samples")
    return "\n".join([
        f"  prompts per step           {prompts}",
        f"  samples per step           {samples}  (= prompts x n={n})",
        f"  mini-batches per step      {samples // mini} x {mini} samples  (optimizer updates per step: "
        f"{samples // mini * cfg.actor.ppo_epochs}, ppo_epochs={cfg.actor.ppo_epochs})",
        f"  data-parallel ranks        {dp_size}  ({per_rank} samples of each mini-batch per rank)",
        f"  micro-batch per rank       {micro}  (gradient accumulation over {-(-per_rank // cfg.actor.micro_batch_size)}"
        f" micro-batches when by count)",
        f"  response tokens per sample <= {cfg.algo.sampling.max_new_tokens}"])


def role_specs(cfg: RunConfig) -> dict[str, RoleSpec]:
    specs = {"actor": RoleSpec(FSDPActor, {"cfg": cfg.actor}),
             "rollout": RoleSpec(RolloutWorker, {"cfg": cfg.rollout})}
    if cfg.use_ref or cfg.actor.kl_loss_coef > 0:
        ref = ActorConfig(model=cfg.actor.model, dtype=cfg.actor.dtype, trainable=False,
                          micro_batch_size=cfg.actor.micro_batch_size, max_tokens_per_micro=cfg.actor.max_tokens_per_micro,
                          temperature=cfg.actor.temperature)
        specs["ref"] = RoleSpec(FSDPActor, {"cfg": ref})
    return specs


def prompt_stream(rows: list[dict], per_step: int, shuffle: bool, seed: int):
    """Endless batches of ``per_step`` rows, reshuffled every epoch."""
    rng = random.Random(seed)
    while True:
        order = list(range(len(rows)))
        if shuffle:
            rng.shuffle(order)
        for i in range(0, len(order) - per_step + 1, per_step):
            yield [rows[j] for j in order[i:i + per_step]]


def fit(cfg: RunConfig) -> list[dict]:
    from tqdm import tqdm

    from core.data.dataset import load_rl_parquet
    from core.models import resolve_model
    from core.placement import place
    from core.rewards import default_compute_score, load_reward_fn

    out = Path(cfg.trainer.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=1, default=str))
    reward_fn = load_reward_fn(cfg.reward.path, cfg.reward.name) if cfg.reward.path else default_compute_score
    rows = load_rl_parquet(cfg.data.train_files, cfg.data.limit or None)
    if len(rows) < cfg.data.prompts_per_step:
        raise ValueError(f"data has {len(rows)} rows, fewer than data.prompts_per_step={cfg.data.prompts_per_step}")
    for model in {cfg.actor.model, cfg.rollout.model}:
        resolve_model(model)  # convert / locate once here, not in every rank at the same time
    val_rows = load_rl_parquet(cfg.data.val_files, cfg.data.val_limit or None) if cfg.data.val_files else []
    actor_pool = cfg.placement.pools[cfg.placement.roles["actor"]]
    dp = 1 if cfg.trainer.backend == "local" else actor_pool.nnodes * actor_pool.slots_per_node
    print("effective sizes:\n" + effective_sizes(cfg, dp), flush=True)
    if cfg.trainer.backend == "ray":
        import ray

        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
    placement = place(cfg.placement, role_specs(cfg), cfg.trainer.backend, cfg.trainer.call_timeout_s)
    roles = Roles(actor=placement["actor"], rollout=placement["rollout"],
                  ref=placement["ref"] if "ref" in placement else None)
    history = []
    stream = prompt_stream(rows, cfg.data.prompts_per_step, cfg.data.shuffle, cfg.trainer.seed)
    val_prompts = prompts_from_rows(val_rows) if val_rows else None

    def val_metrics() -> dict:
        return validate(roles, val_prompts, cfg.algo.sampling, reward_fn, cfg.algo.reward_workers,
                        cfg.algo.reward_timeout_s)

    try:
        with (out / "metrics.jsonl").open("a") as log, tqdm(total=cfg.trainer.total_steps, desc="steps") as bar:
            if val_prompts is not None:  # the untrained policy's held-out score: the start of the val curve
                history.append({"step": 0, **val_metrics()})
                log.write(json.dumps(history[-1]) + "\n")
                bar.write(f"step 0: val reward {history[-1]['val/reward/mean']:.3f} ({len(val_rows)} held-out prompts)")
            for i in range(cfg.trainer.total_steps):
                _, metrics = step(roles, prompts_from_rows(next(stream)), cfg.algo, reward_fn)
                metrics = {"step": i + 1, **metrics}
                last = i + 1 == cfg.trainer.total_steps
                if val_prompts is not None and (last or (cfg.trainer.val_every and (i + 1) % cfg.trainer.val_every == 0)):
                    metrics |= val_metrics()
                log.write(json.dumps(metrics) + "\n")
                log.flush()
                history.append(metrics)
                bar.update(1)
                bar.write(f"step {i + 1}: reward {metrics['reward/mean']:.3f} | len {metrics['response_length/mean']:.0f}"
                          f" | pg_loss {metrics['actor/pg_loss']:.4f} | kl {metrics['actor/kl_loss']:.4f}"
                          f" | {metrics['timing_s/step']:.1f}s"
                          + (f" | val {metrics['val/reward/mean']:.3f}" if "val/reward/mean" in metrics else ""))
    finally:
        placement.shutdown()
    print("summary:\n" + report(history, out / "curves.png"), flush=True)
    return history
