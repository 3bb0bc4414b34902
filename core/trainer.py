"""``fit(cfg)``: place the roles, stream prompts, run ``core.loop.step`` for ``total_steps``, log every step.

Every step appends one JSON line to ``<output_dir>/metrics.jsonl`` (a fresh run first moves an earlier run's file
aside; only a resume keeps it, cut back to the checkpoint's step); the console gets a progress bar and a
one-line summary per step. At start it prints the effective batch sizes in their units -- the most asked
question about verl's config; at the end, ``core.report``'s summary and ``<output_dir>/curves.png``.
"""

from __future__ import annotations

import json
import os
import math
import random
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

import torch

from core import checkpoint
from core.checks import ConfigError, check_data_sources, check_run
from core.config import ActorConfig, CriticConfig, RunConfig
from core.train.critic import FSDPCritic, ValueWorker
from core.train.fsdp import FSDPActor
from core.train.lora import LoraReference
from core.train.policy import PolicyWorker
from core.train.reward_model import RewardModelWorker
from core.implicit_prm import prm_actor_config
from core.loop import Roles, kl_controller, prompts_from_rows, step, sync_rollout, validate
from core.one_step_off import RolloutAhead
from core.report import report
from core.rollout.worker import RolloutWorker
from core.tools import isolation
from core.tracking import make_trackers
from core.worker import RoleSpec
from core.worker_group import RoleGroup, WorkerError, init_ray

AHEAD_FILE = "rollout_ahead.pt"  # in a one-step-off run's checkpoint: the next step's samples, generated ahead


def dp_size(cfg: RunConfig) -> int:
    """The actor's data-parallel ranks: its pool's (over Megatron's tp x pp grid), or 1 with the local backend."""
    pool = cfg.placement.pools[cfg.placement.roles["actor"]]
    grid = cfg.actor.megatron.tp * cfg.actor.megatron.pp
    return 1 if cfg.trainer.backend == "local" else pool.nnodes * pool.slots_per_node // grid


def effective_sizes(cfg: RunConfig, dp_size: int) -> str:
    """The batch-size arithmetic in words, printed at start."""
    n, prompts = cfg.algo.sampling.n, cfg.data.train_prompts_per_step or cfg.data.prompts_per_step
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


def policy_spec(actor: ActorConfig) -> RoleSpec:
    """The actor's (or the reference's) role on its training engine; a Megatron model replica's tp x pp ranks, or
    a Ulysses group's ulysses_sp ranks, share one chunk of rows."""
    if actor.strategy == "megatron":
        from core.train.megatron_actor import MegatronActor

        return RoleSpec(MegatronActor, {"cfg": actor}, mp_size=actor.megatron.tp * actor.megatron.pp)
    return RoleSpec(FSDPActor, {"cfg": actor}, mp_size=actor.ulysses_sp)  # a sequence-parallel group shares rows


def critic_spec(critic: CriticConfig) -> RoleSpec:
    """The critic's role on its training engine (a Megatron model replica's TP ranks share one chunk of rows)."""
    if critic.strategy == "megatron":
        from core.train.megatron_critic import MegatronCritic

        return RoleSpec(MegatronCritic, {"cfg": critic}, mp_size=critic.megatron.tp)
    return RoleSpec(FSDPCritic, {"cfg": critic})


def role_specs(cfg: RunConfig) -> dict[str, RoleSpec]:
    specs = {"actor": policy_spec(cfg.actor),
             # a tensor-parallel engine's replica spans tensor_parallel_size ranks: they share one chunk of prompts
             "rollout": RoleSpec(RolloutWorker, {"cfg": cfg.rollout,
                                                 "max_response_length": max(cfg.algo.sampling.max_new_tokens,
                                                                            cfg.algo.val_sampling.max_new_tokens,
                                                                            cfg.rollout.agent.max_response_tokens
                                                                            if cfg.rollout.agent.enable else 0)},
                                 mp_size=cfg.rollout.tensor_parallel_size)}
    if cfg.has_reference():
        ref = ActorConfig(model=cfg.actor.model, dtype=cfg.actor.dtype, trainable=False,
                          micro_batch_size=cfg.actor.micro_batch_size, max_tokens_per_micro=cfg.actor.max_tokens_per_micro,
                          temperature=cfg.actor.temperature, offload=cfg.actor.offload, strategy=cfg.actor.strategy,
                          megatron=cfg.actor.megatron, ulysses_sp=cfg.actor.ulysses_sp)
        specs["ref"] = (policy_spec(ref) if not cfg.actor.lora.rank
                        else RoleSpec(LoraReference, mp_size=cfg.actor.ulysses_sp))  # the actor's forward: its groups
    if cfg.use_critic:
        specs["critic"] = critic_spec(cfg.critic)
    if cfg.use_reward_model:
        specs["reward_model"] = RoleSpec(RewardModelWorker, {"cfg": cfg.reward_model, "policy_model": cfg.actor.model})
    if cfg.implicit_prm.enable:  # PRIME's implicit PRM: a policy on the FSDP engine whose loss is implicit_prm
        specs["prm"] = policy_spec(prm_actor_config(cfg))
    return specs


class PromptStream:
    """Endless batches of ``per_step`` rows. Epoch e's order is a shuffle seeded by (seed, e), so the position
    is two integers that a checkpoint holds (``state``) and a resumed run continues from."""

    def __init__(self, rows: list[dict], per_step: int, shuffle: bool, seed: int, epoch: int = 0, index: int = 0):
        self.rows, self.per_step, self.shuffle, self.seed = rows, per_step, shuffle, seed
        self.epoch, self.index = epoch, index
        self._order: tuple[int, list[int]] | None = None

    def state(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def __iter__(self):
        return self

    def __next__(self) -> list[dict]:
        if self.index + self.per_step > len(self.rows):  # the epoch's remainder is dropped
            self.epoch, self.index = self.epoch + 1, 0
        if self._order is None or self._order[0] != self.epoch:
            order = list(range(len(self.rows)))
            if self.shuffle:
                random.Random(f"{self.seed}-{self.epoch}").shuffle(order)
            self._order = (self.epoch, order)
        batch = [self.rows[j] for j in self._order[1][self.index:self.index + self.per_step]]
        self.index += self.per_step
        return batch


def fit(cfg: RunConfig, step_fn: Callable | None = None) -> list[dict]:
    """Run ``cfg``. ``step_fn(roles, draw, algo, reward_fn, update_actor=, kl_ctrl=) -> (batch, metrics)`` replaces
    ``core.loop.step`` for an algorithm whose step differs (a recipe's own copy of the loop, e.g. DAPO's dynamic
    sampling); ``draw()`` returns the next prompt batch, as many times as the step needs."""
    from tqdm import tqdm

    check_run(cfg)  # how the sections agree, before anything is loaded or started
    if step_fn is None and cfg.data.train_prompts_per_step not in (0, cfg.data.prompts_per_step):
        raise ConfigError(f"data.train_prompts_per_step={cfg.data.train_prompts_per_step} differs from "
                          f"data.prompts_per_step={cfg.data.prompts_per_step}, but core's step trains every prompt "
                          "it draws; it is for a recipe's step that filters (e.g. DAPO's): drop it, or run that recipe")
    t, out = cfg.trainer, Path(cfg.trainer.output_dir)
    os.environ[isolation.ENV] = cfg.tools.isolation  # this process's reward workers; Ray's: start_roles
    reward_fn, rows, val_rows = load_inputs(cfg, out)
    check_tools_isolation(cfg, rows + val_rows)
    trackers = make_trackers(t.logger, out, t.project_name, t.experiment_name or out.name, asdict(cfg),
                             t.tracker_mode, write=tqdm.write)  # before Ray: a missing package fails here
    placement, roles = start_roles(cfg, trackers)
    val_prompts = prompts_from_rows(val_rows) if val_rows else None
    val_sampling = replace(cfg.algo.val_sampling,
                           max_new_tokens=cfg.algo.val_sampling.max_new_tokens or cfg.algo.sampling.max_new_tokens)
    kl_ctrl, nonfinite = kl_controller(cfg.algo), 0
    run_step = step_fn or (lambda roles_, draw, *a, **k: step(roles_, draw(), *a, **k))
    try:
        start, stream, history = resume(cfg, out, roles, rows, kl_ctrl)
        draw = roles.ahead.draw if roles.ahead is not None else lambda: prompts_from_rows(next(stream))
        with (out / "metrics.jsonl").open("a") as log, tqdm(total=t.total_steps, initial=start, desc="steps") as bar:
            def record(metrics: dict) -> None:
                log.write(json.dumps(metrics) + "\n")
                log.flush()
                history.append(metrics)
                for tracker in trackers:
                    tracker.log(metrics, metrics["step"])

            def held_out(step: int) -> dict:
                metrics, shown = validate(roles, val_prompts, val_sampling, reward_fn, cfg.algo.reward_workers,
                                          cfg.algo.reward_timeout_s, t.log_val_generations)
                if shown:
                    with (out / "val_generations.jsonl").open("a") as f:
                        f.writelines(json.dumps({"step": step, **s}) + "\n" for s in shown)
                return metrics

            if val_prompts is not None and start == 0:  # the untrained policy's held-out score: the val curve's start
                record({"step": 0, **held_out(0)})
            for i in range(start, t.total_steps):
                # a fresh sampling seed each step: the same seed would replay the same uniforms every step
                algo = replace(cfg.algo, sampling=replace(cfg.algo.sampling, seed=cfg.algo.sampling.seed + i))
                _, metrics = run_step(roles, draw, algo, reward_fn, update_actor=i >= t.critic_warmup, kl_ctrl=kl_ctrl)
                metrics = {"step": i + 1, **metrics}
                if val_prompts is not None and due(i + 1, t.test_freq, t.total_steps):
                    metrics |= held_out(i + 1)
                record(metrics)  # written before a stop below: nothing of the step is lost
                nonfinite = count_nonfinite(metrics, nonfinite, t.max_nonfinite_grad_steps, out)
                if t.save_freq and due(i + 1, t.save_freq, t.total_steps):
                    save(out, i + 1, roles, stream, kl_ctrl, cfg)
                bar.update(1)
    except WorkerError as e:  # a worker (or a whole node) lost, a call that failed or hung: say where to resume
        raise RunStopped(stopped_message(out, e)) from e
    finally:
        placement.shutdown()
        for tracker in trackers:
            tracker.close()
    print("summary:\n" + report(history, out / "curves.png"), flush=True)
    return history


class RunStopped(RuntimeError):
    """A run stopped by a worker failure; the message names the failure and the checkpoint to resume from."""


def stopped_message(out: Path, e: WorkerError) -> str:
    """What failed (role, rank, node: the error's first line) and where the run can go on from."""
    last = checkpoint.find(out, "auto")
    resume = (f"the last checkpoint is {last} (intact: checkpoints are committed whole). Bring the lost worker or node "
              f"back (ray status) and run the same command again: trainer.resume_mode=auto (the default) resumes from "
              f"it" if last is not None else "no checkpoint was saved (trainer.save_freq): a rerun starts from step 0")
    return f"the run stopped: {str(e).splitlines()[0]}\n{resume}"


def load_inputs(cfg: RunConfig, out: Path) -> tuple[Callable, list[dict], list[dict]]:
    """Before Ray: the output folder and its config.json, the reward, the data rows (sources checked, prompt
    lengths fitted), the models located or converted once. Returns (reward_fn, train rows, val rows)."""
    from core.data.dataset import fit_prompt_lengths, load_rl_parquet
    from core.models import load_tokenizer, resolve_model
    from core.rewards import default_compute_score, load_reward_fn
    from core.data.vision_inputs import image_prompt_problem
    from core.vision_processors import processor_for

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=1, default=str))
    reward_fn = load_reward_fn(cfg.reward.path, cfg.reward.name) if cfg.reward.path else default_compute_score
    rows = load_rl_parquet(cfg.data.train_files, cfg.data.limit or None)
    for model in {cfg.actor.model, cfg.rollout.model}:
        resolve_model(model)  # convert / locate once here, not in every rank at the same time
    val_rows = load_rl_parquet(cfg.data.val_files, cfg.data.val_limit or None) if cfg.data.val_files else []
    check_data_sources(rows, f"data.train_files {cfg.data.train_files}", bool(cfg.reward.path))
    check_data_sources(val_rows, f"data.val_files {cfg.data.val_files}", bool(cfg.reward.path))
    tokenizer = load_tokenizer(cfg.rollout.model)  # each prompt's length, once, before Ray
    processor = processor_for(cfg.rollout.model)  # image prompts: measured with their image-token runs
    pictured = next((r for r in rows + val_rows if "images" in r), None)
    if pictured is not None and (problem := image_prompt_problem(cfg.rollout)):
        raise ConfigError(f"{pictured['where']}: {problem}")
    if cfg.actor.ulysses_sp > 1:
        from transformers import AutoConfig

        heads = AutoConfig.from_pretrained(resolve_model(cfg.actor.model)).num_attention_heads
        if heads % cfg.actor.ulysses_sp:
            raise ConfigError(f"actor.ulysses_sp={cfg.actor.ulysses_sp} must divide {cfg.actor.model}'s {heads} "
                              "attention heads (each rank of a group attends for its share of them)")
    for name, role in (("actor", cfg.actor), ("critic", cfg.critic if cfg.use_critic else None)):
        if role is not None and role.strategy == "megatron":
            from transformers import AutoConfig

            from core.train.megatron_actor import run_problem

            c = AutoConfig.from_pretrained(resolve_model(role.model))
            mixed = getattr(c, "decoder_sparse_step", 1) != 1 or bool(getattr(c, "mlp_only_layers", None))
            if problem := run_problem(role, c.model_type, c.num_attention_heads, pictured is not None, name,
                                      c.num_hidden_layers, mixed):
                raise ConfigError(problem)
    for name, part in (("train", rows), ("val", val_rows)):
        if part:
            fitted, note = fit_prompt_lengths(part, tokenizer, cfg.rollout.max_prompt_length, cfg.data.truncation,
                                              cfg.data.filter_overlong_prompts, processor)
            part[:] = fitted
            print(f"{name} data: {note}", flush=True)
    if len(rows) < cfg.data.prompts_per_step:
        raise ValueError(f"data has {len(rows)} rows, fewer than data.prompts_per_step={cfg.data.prompts_per_step}")
    return reward_fn, rows, val_rows


def check_tools_isolation(cfg: RunConfig, rows: list[dict]) -> None:
    """A run that executes model-written code (agent tools, a code reward's data source) with
    ``tools.isolation: namespaces`` where namespaces cannot be made fails here, before Ray, with what allows it."""
    from core.rewards.code_tests import SOURCES

    runs_code = cfg.rollout.agent.enable or any(r.get("data_source") in SOURCES for r in rows)
    if runs_code and cfg.tools.isolation == "namespaces" and (why := isolation.probe()):
        raise ConfigError(isolation.refusal(why))


def start_roles(cfg: RunConfig, trackers: list) -> tuple:
    """Ray (with backend ray) and the worker groups of every role; the trackers' runs end if a worker fails to
    start (no dangling "running" runs). Returns (placement, Roles)."""
    from core.placement import place

    print("effective sizes:\n" + effective_sizes(cfg, dp_size(cfg)), flush=True)
    placement = None
    try:
        if cfg.trainer.backend == "ray":
            env = dict(cfg.trainer.runtime_env)  # every worker runs tools with the run's isolation
            env["env_vars"] = {**env.get("env_vars", {}), isolation.ENV: cfg.tools.isolation}
            init_ray(cfg.trainer.ray_address, env)
        placement = place(cfg.placement, role_specs(cfg), cfg.trainer.backend, cfg.trainer.call_timeout_s,
                          cfg.trainer.node_loss_timeout_s)
        roles = Roles(actor=placement["actor"], rollout=placement["rollout"],
                      ref=placement["ref"] if "ref" in placement else None,
                      critic=placement["critic"] if "critic" in placement else None,
                      reward_model=placement["reward_model"] if "reward_model" in placement else None,
                      prm=placement["prm"] if "prm" in placement else None)
        if cfg.trainer.backend == "ray" and (cfg.trainer.save_freq or cfg.trainer.resume_mode != "disable"):
            check_shared_output(Path(cfg.trainer.output_dir), roles)  # before step 1, not at the first save
    except BaseException:
        for tracker in trackers:
            tracker.close()
        if placement is not None:
            placement.shutdown()
        raise
    return placement, roles


def resume(cfg: RunConfig, out: Path, roles: Roles, rows: list[dict], kl_ctrl) -> tuple[int, "PromptStream", list]:
    """The checkpoint ``trainer.resume_mode`` names, if any: weights, optimizer, RNG, data position, KL controller,
    the engine synced, metrics.jsonl rewound. Else a fresh start (an earlier run's metrics moved aside).
    Returns (first step, prompt stream, metrics so far)."""
    stream = PromptStream(rows, cfg.data.prompts_per_step, cfg.data.shuffle, cfg.trainer.seed)
    if cfg.trainer.async_.one_step_off:  # the rollout one step ahead, drawing from the stream
        roles.ahead = RolloutAhead(roles.rollout, lambda: prompts_from_rows(next(stream)), cfg.trainer.async_.overlap)
    resumed = checkpoint.find(out, cfg.trainer.resume_mode)
    if resumed is None:  # a fresh run starts a fresh file: appending would mix two runs in one history and report
        set_aside_metrics(out / "metrics.jsonl")
        return 0, stream, []
    state = checkpoint.driver_state(resumed)
    for name, group, worker in trained_roles(roles):
        group.call_all(worker.load_checkpoint, str(resumed / name))
    sync_rollout(roles, cfg.algo.sync_timeout_s)
    stream = PromptStream(rows, cfg.data.prompts_per_step, cfg.data.shuffle, cfg.trainer.seed, **state["stream"])
    if roles.ahead is not None:  # the samples generated ahead when the checkpoint was saved (none: made at step 1)
        roles.ahead.version = state["step"]
        if (resumed / AHEAD_FILE).is_file():
            roles.ahead.load_state_dict(torch.load(resumed / AHEAD_FILE, weights_only=False))
    if kl_ctrl is not None:
        kl_ctrl.load_state_dict(state["kl_ctrl"])
    print(f"resumed from {resumed} (step {state['step']})", flush=True)
    return state["step"], stream, rewind_metrics(out / "metrics.jsonl", state["step"])


def due(step_no: int, every: int, total: int) -> bool:
    """Validation / a save after step ``step_no``: every ``every`` steps (0 = never) and after the last step."""
    return step_no == total or (every > 0 and step_no % every == 0)


def count_nonfinite(metrics: dict, count: int, limit: int, out: Path) -> int:
    """Consecutive steps whose actor gradient norm was inf/nan; the run stops at ``limit`` (0 = never)."""
    count = count + 1 if not math.isfinite(metrics.get("actor/grad_norm", 0.0)) else 0
    if 0 < limit <= count:
        raise FloatingPointError(
            f"step {metrics['step']}: the actor's gradient norm was inf/nan for {count} consecutive steps, so their "
            f"optimizer steps were skipped (actor/nonfinite_grad_frac in {out / 'metrics.jsonl'}). Lower "
            "actor.optim.lr or check the rewards and advantages; trainer.max_nonfinite_grad_steps "
            f"(now {limit}) sets the limit, 0 = never stop")
    return count


def save(out: Path, step_no: int, roles: Roles, stream: "PromptStream", kl_ctrl, cfg: RunConfig) -> None:
    """A checkpoint after ``step_no``: every saving rank's shards, then the driver's state, committed atomically."""
    tmp = checkpoint.begin(out, step_no)
    for name, group, worker in trained_roles(roles):
        group.call_all(worker.save_checkpoint, str(tmp / name))
    state = {"step": step_no, "stream": stream.state(), "model": cfg.actor.model}
    if cfg.actor.lora.rank:  # export rebuilds the adapted model from it
        state["lora"] = asdict(cfg.actor.lora)
    if kl_ctrl is not None:
        state["kl_ctrl"] = kl_ctrl.state_dict()
    if roles.ahead is not None:  # one step off: the next step's samples, already generated
        torch.save(roles.ahead.state_dict(), tmp / AHEAD_FILE)
    checkpoint.commit(tmp, state, cfg.trainer.save_keep, saved_ranks(roles))


def trained_roles(roles: Roles) -> list[tuple[str, RoleGroup, type]]:
    """(name, group, worker interface) of each role whose weights train, so checkpoints hold them: the actor, and
    the critic and the implicit PRM when the run has them."""
    out = [("actor", roles.actor, PolicyWorker)]
    out += [("critic", roles.critic, ValueWorker)] if roles.critic is not None else []
    return out + ([("prm", roles.prm, PolicyWorker)] if roles.prm is not None else [])


def saved_ranks(roles: Roles) -> dict[str, int]:
    """The roles that write checkpoint shards, and how many ranks each."""
    return {name: group.world_size for name, group, _ in trained_roles(roles)}


def check_shared_output(out: Path, roles: Roles) -> None:
    """Every rank that saves reads a file the driver wrote under ``out`` and writes one back that the driver must
    see (``core.checkpoint.write_probe``): on a node-local ``output_dir`` the run stops here, naming the rank."""
    folder, token = checkpoint.write_probe(out)
    answers = [a for name, group, worker in trained_roles(roles)
               for a in group.call_all(worker.answer_probe, str(folder), token, name)]
    names = [f"{role}_rank{r}" for role, n in saved_ranks(roles).items() for r in range(n)]
    checkpoint.check_probes(folder, token, names, answers)


def set_aside_metrics(path: Path) -> Path | None:
    """Move an earlier run's non-empty ``metrics.jsonl`` to ``metrics.<its modification time>.jsonl`` (never
    overwriting one already set aside) and say so; returns the new path, or None when there was nothing."""
    if not path.is_file() or path.stat().st_size == 0:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))
    aside, k = path.with_name(f"metrics.{stamp}.jsonl"), 1
    while aside.exists():
        aside, k = path.with_name(f"metrics.{stamp}-{k}.jsonl"), k + 1
    path.rename(aside)
    print(f"{path} holds an earlier run and this run starts fresh (no checkpoint to resume): moved it to {aside}",
          flush=True)
    return aside


def rewind_metrics(path: Path, step: int) -> list[dict]:
    """Keep the rows of steps <= ``step`` (a resumed run writes the later ones again); returns them."""
    from core.report import read_metrics

    rows = [m for m in read_metrics(path) if m["step"] <= step] if path.is_file() else []
    checkpoint.write_atomic(path, "".join(json.dumps(m) + "\n" for m in rows))
    return rows
