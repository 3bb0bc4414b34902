"""``fit(cfg)``: place the roles, stream prompts, run ``core.loop.step`` for ``total_steps``, log every step.

Every step appends one JSON line to ``<output_dir>/metrics.jsonl`` (a fresh run first moves an earlier run's file
aside; only a resume keeps it, cut back to the checkpoint's step); the console gets a progress bar and a
one-line summary per step. At start it prints the effective batch sizes in their units -- the most asked
question about verl's config; at the end, ``core.report``'s summary and ``<output_dir>/curves.png``. Which worker
runs each role: ``core.roles``; checkpoints and resume: ``core.run_state``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from core import determinism
from core.checks import check_data_sources, check_files, check_inputs, check_run
from core.config import ConfigError, RunConfig, reads
from core.data.prompt_stream import PromptStream
from core.loop import Roles, check_rollout, kl_controller, prompts_from_rows, step, validate
from core.one_step_off import RolloutAhead
from core.streaming import RolloutStream
from core.plan_report import dp_size, effective_sizes
from core.protocol import Batch
from core.replicas import RolloutReplicas
from core.report import report
from core.roles import role_specs
from core.checkpoint import checkpoint_dir, find as find_checkpoint
from core.preemption import Preempted, PreemptionWatch
from core.run_state import RunStopped, check_shared_output, resume, save, stopped_message
from core.tools import isolation
from core.train.policy import PolicyWorker
from core.tracking import MetricsLog, make_trackers
from core.worker_group import WorkerError, init_ray


def fit(cfg: RunConfig, step_fn: Callable | None = None, given: reads.Given | None = None,
        sizes: str | None = None) -> list[dict]:
    """Run ``cfg``. ``step_fn(roles, draw, algo, reward_fn, update_actor=, kl_ctrl=) -> (batch, metrics)`` replaces
    ``core.loop.step`` for an algorithm whose step differs (a recipe's own copy of the loop, e.g. DAPO's dynamic
    sampling); ``draw()`` returns the next prompt batch, as many times as the step needs. ``sizes``: that step's
    account of its batch sizes, printed at start in place of the RL step's (SFT: conversations, packed rows). ``given``: the keys the
    user set; those that nothing read by the end of the first step that updates the actor are warned of
    (``core.config.reads``)."""
    try:
        return _fit(cfg, step_fn, given, sizes)
    finally:
        reads.stop()  # however the run ends, no hooks stay behind in this process


def _fit(cfg: RunConfig, step_fn: Callable | None, given: reads.Given | None, sizes: str | None) -> list[dict]:
    with reads.paused():  # a check reading a key is no use of it
        check_run(cfg, own_step=step_fn is not None)  # how the sections agree, before anything is loaded or started
        check_files(cfg)  # data, reward file, output dir, local model paths
    if given is not None:  # record which keys the driver and every worker read, up to the end of the first step
        reads.label(cfg)
        for name, section in given.sections.items():
            reads.label(section, name)
        reads.start(cfg, given.sections)
    t, out = cfg.trainer, Path(cfg.trainer.output_dir)
    reward_fn, rows, val_rows = load_inputs(cfg, out)
    if t.total_epochs:  # passes over the data: the step count follows from the rows loaded
        cfg = replace(cfg, trainer=replace(t, total_steps=epoch_steps(cfg, len(rows))))
        t = cfg.trainer
        if given is not None:
            reads.label(cfg)
    with reads.paused():  # copying the config is no use of its keys
        config = asdict(cfg)
    trackers = make_trackers(t.logger, out, t.project_name, t.experiment_name or out.name, config,
                             t.tracker_mode, write=tqdm.write)  # before Ray: a missing package fails here
    placement, roles = start_roles(cfg, trackers, sizes)
    stream, draw = prompt_source(cfg, roles, rows)
    val_prompts = prompts_from_rows(val_rows) if val_rows else None
    kl_ctrl, nonfinite = kl_controller(cfg.algo), 0
    keep = t.save_keep  # checkpoints kept: the run's policy from its start (and a read before the first save)
    run_step = step_fn or (lambda roles_, draw_, *a, **k: step(roles_, draw_(), *a, **k))
    preempt, i = PreemptionWatch(t.preempt_deadline_s).__enter__(), None
    try:
        start, history = resume(cfg, out, roles, stream, kl_ctrl)
        with MetricsLog(out / "metrics.jsonl", history, trackers) as log, \
                tqdm(total=t.total_steps, initial=start, desc="steps") as bar:
            if val_prompts is not None and start == 0:  # the untrained policy's held-out score: the curve's start
                log.record({"step": 0, **held_out(cfg, roles, val_prompts, reward_fn, out, 0)})
            for i in range(start, t.total_steps):
                # a fresh sampling seed each step: the same seed would replay the same uniforms every step
                algo = replace(cfg.algo, sampling=replace(cfg.algo.sampling, seed=cfg.algo.sampling.seed + i))
                batch, metrics = run_step(roles, draw, algo, reward_fn, update_actor=i >= t.critic_warmup,
                                          kl_ctrl=kl_ctrl)
                log_lengths(out / LENGTHS, i + 1, batch, fresh=i == start == 0)
                metrics = {"step": i + 1, **metrics}
                if isinstance(roles.rollout, RolloutReplicas):
                    metrics |= roles.rollout.metrics()
                if t.deterministic:  # the step's weights, to compare runs step by step
                    metrics[determinism.DIGEST_KEY] = roles.actor.call_all(PolicyWorker.weights_sha256)[0]
                if val_prompts is not None and due(i + 1, t.test_freq, t.total_steps):
                    metrics |= held_out(cfg, roles, val_prompts, reward_fn, out, i + 1)
                saved = bool(t.save_freq) and due(i + 1, t.save_freq, t.total_steps)
                if saved:  # the rollout engines' weights against the trainer's (delta syncs)
                    metrics |= check_rollout(roles, cfg.algo.sync_timeout_s)
                log.record(metrics)  # written before a stop below: nothing of the step is lost
                nonfinite = count_nonfinite(metrics, nonfinite, t.max_nonfinite_grad_steps, out)
                preempt.step_ended()
                if saved or preempt.requested:
                    save(out, i + 1, roles, stream, kl_ctrl, cfg, keep)
                bar.update(1)
                if given is not None and i == max(start, t.critic_warmup):  # every role has read what it reads
                    for line in given.warnings(placement.config_reads() | reads.stop()):
                        tqdm.write(f"warning: {line}")
                if preempt.requested:
                    raise Preempted(f"{preempt.requested} after step {i + 1}: checkpoint {checkpoint_dir(out)}/"
                                    f"step_{i + 1:06d} written; run the same command to resume from it "
                                    "(trainer.resume_mode=auto)")
    except WorkerError as e:  # a worker (or a whole node) lost, a call that failed or hung: say where to resume
        if preempt.requested:  # the scheduler's signal reached a worker's process group first
            raise Preempted(preempted_midstep(out, preempt.requested, i, "a worker stopped")) from e
        raise RunStopped(stopped_message(out, e)) from e
    except KeyboardInterrupt:  # the deadline passed inside a step (or Ctrl-C)
        if preempt.requested:
            raise Preempted(preempted_midstep(out, preempt.requested, i, f"it did not end within "
                                              f"trainer.preempt_deadline_s={t.preempt_deadline_s:g}s")) from None
        raise
    finally:
        preempt.__exit__(None, None, None)
        placement.shutdown()
        for tracker in trackers:
            tracker.close()
    print("summary:\n" + report(history, out / "curves.png"), flush=True)
    return history


LENGTHS = "lengths.jsonl"  # every step's response lengths (for hybridrl plan --time --lengths)


def log_lengths(path: Path, step_no: int, batch: Batch, fresh: bool) -> None:
    """One line of the step's response lengths (model tokens) and prompt lengths: ``{"step": k, "response_lengths":
    [...], "prompt_lengths": [...]}``, and for agent rollouts each sample's ``turns``: its token runs, model turn and
    tool answer alternating (what ``hybridrl plan --time`` replays); a fresh run starts the file anew, a resumed one
    appends (a step logged twice: the later line counts)."""
    row = {"step": step_no, "response_lengths": [], "prompt_lengths": []}
    if batch is not None and "response_mask" in batch:
        row["response_lengths"] = batch["response_mask"].sum(-1).long().tolist()
    if batch is not None and "prompts" in batch and "attention_mask" in batch:
        Tp = batch["prompts"].shape[1]
        row["prompt_lengths"] = batch["attention_mask"][:, :Tp].sum(-1).long().tolist()
        if "num_turns" in batch and "response_mask" in batch:
            row["turns"] = [token_runs(m, a) for m, a in zip(batch["response_mask"].tolist(),
                                                              batch["attention_mask"][:, Tp:].tolist())]
    with path.open("w" if fresh else "a") as f:
        f.write(json.dumps(row) + "\n")


def token_runs(model: list[float], attended: list[float]) -> list[int]:
    """A response's runs of model tokens and of tool tokens, alternating from a model run and ending with one
    (padding left out): mask 1 1 0 0 0 1, attended 1 1 1 1 1 1 1 0 -> [2, 3, 1]."""
    runs: list[int] = []
    for m, a in zip(model, attended):
        if not a:
            continue
        while not runs or (len(runs) - 1) % 2 != (0 if m else 1):  # model runs at even places, tool runs at odd
            runs.append(0)
        runs[-1] += 1
    return runs if len(runs) % 2 else runs + [0]


def preempted_midstep(out: Path, signal_name: str, i: int | None, why: str) -> str:
    last = find_checkpoint(out, "auto")
    return (f"{signal_name} during step {(i or 0) + 1}, abandoned ({why}); "
            + (f"run the same command to resume from {last}" if last else "no checkpoint yet: a rerun starts over"))


def epoch_steps(cfg: RunConfig, rows: int) -> int:
    """``trainer.total_epochs`` passes over ``rows`` prompts, ``data.prompts_per_step`` a step, a last partial batch
    dropped (verl's ``len(dataloader) * total_epochs``)."""
    per_epoch = rows // cfg.data.prompts_per_step
    print(f"trainer.total_epochs={cfg.trainer.total_epochs}: {cfg.trainer.total_epochs} x {per_epoch} steps "
          f"({rows} prompts // data.prompts_per_step={cfg.data.prompts_per_step}) = "
          f"{cfg.trainer.total_epochs * per_epoch} steps", flush=True)
    return cfg.trainer.total_epochs * per_epoch


def prompt_source(cfg: RunConfig, roles: Roles, rows: list[dict]) -> tuple[PromptStream, Callable[[], Batch]]:
    """The prompt stream over ``rows`` and the step's ``draw()``: the stream's next batch, or one step off
    (``trainer.async.mode=one_step_off``) the batch the rollout generated ahead, or streaming the rollout stream's
    next batch, which draw from the prompt stream themselves."""
    stream = PromptStream(rows, cfg.data.prompts_per_step, cfg.data.shuffle, cfg.trainer.seed)

    def draw() -> Batch:
        return prompts_from_rows(next(stream))

    a = cfg.trainer.async_
    if a.mode == "one_step_off":
        roles.ahead = RolloutAhead(roles.rollout, draw, a.overlap)
        return stream, roles.ahead.draw
    if a.mode == "streaming":
        roles.stream = RolloutStream(roles.rollout, draw, cfg.data.prompts_per_step, cfg.algo.sampling.seed,
                                     a.max_staleness, a.on_stale, a.chunk_steps, a.overlap_steps,
                                     a.partial_kv == "recompute")
        return stream, roles.stream.draw
    return stream, draw


def held_out(cfg: RunConfig, roles: Roles, prompts: Batch, reward_fn: Callable, out: Path, step_no: int) -> dict:
    """The held-out set's metrics (``val/*``) under the current policy; ``trainer.log_val_generations`` of its
    samples appended to ``<output_dir>/val_generations.jsonl``."""
    sampling = replace(cfg.algo.val_sampling,
                       max_new_tokens=cfg.algo.val_sampling.max_new_tokens or cfg.algo.sampling.max_new_tokens)
    metrics, shown = validate(roles, prompts, sampling, reward_fn, cfg.algo.reward_workers,
                              cfg.algo.reward_timeout_s, cfg.trainer.log_val_generations)
    if shown:
        with (out / "val_generations.jsonl").open("a") as f:
            f.writelines(json.dumps({"step": step_no, **s}) + "\n" for s in shown)
    return metrics


def load_inputs(cfg: RunConfig, out: Path) -> tuple[Callable, list[dict], list[dict]]:
    """Before Ray: the output folder and its config.json, the reward, the data rows (sources checked, prompt
    lengths fitted, ``core.checks.check_inputs``), the models located or converted once. Returns (reward_fn,
    train rows, val rows)."""
    from core.data.dataset import fit_prompt_lengths, load_rl_parquet
    from core.models import load_tokenizer, resolve_model
    from core.rewards import default_compute_score, load_reward_fn
    from core.vision_processors import processor_for

    os.environ[isolation.ENV] = cfg.tools.isolation  # this process's reward workers; Ray's: start_roles
    out.mkdir(parents=True, exist_ok=True)
    with reads.paused():  # copying the config is no use of its keys
        (out / "config.json").write_text(json.dumps(asdict(cfg), indent=1, default=str))
    reward_fn = load_reward_fn(cfg.reward.path, cfg.reward.name) if cfg.reward.path else default_compute_score
    rows = load_rl_parquet(cfg.data.train_files, cfg.data.limit or None)
    for model in {cfg.actor.model, cfg.rollout.model, cfg.teacher.model} - {""}:
        resolve_model(model)  # convert / locate once here, not in every rank at the same time
    val_rows = load_rl_parquet(cfg.data.val_files, cfg.data.val_limit or None) if cfg.data.val_files else []
    check_data_sources(rows, f"data.train_files {cfg.data.train_files}", bool(cfg.reward.path))
    check_data_sources(val_rows, f"data.val_files {cfg.data.val_files}", bool(cfg.reward.path))
    with reads.paused():  # a check reading a key is no use of it
        check_inputs(cfg, rows + val_rows)
    tokenizer = load_tokenizer(cfg.rollout.model)  # each prompt's length, once, before Ray
    processor = processor_for(cfg.rollout.model)  # image prompts: measured with their image-token runs
    for name, part in (("train", rows), ("val", val_rows)):
        if part:
            fitted, note = fit_prompt_lengths(part, tokenizer, cfg.rollout.max_prompt_length, cfg.data.truncation,
                                              cfg.data.filter_overlong_prompts, processor)
            part[:] = fitted
            print(f"{name} data: {note}", flush=True)
    if len(rows) < cfg.data.prompts_per_step:
        raise ConfigError(f"data.train_files: {len(rows)} rows left (the note above says what was dropped), fewer than "
                          f"data.prompts_per_step={cfg.data.prompts_per_step}; add data, lower data.prompts_per_step, "
                          f"or raise rollout.max_prompt_length={cfg.rollout.max_prompt_length}", "data.train_files")
    return reward_fn, rows, val_rows


def start_roles(cfg: RunConfig, trackers: list, sizes: str | None = None) -> tuple:
    """Ray (with backend ray) and the worker groups of every role; the trackers' runs end if a worker fails to
    start (no dangling "running" runs). ``sizes``: a recipe step's own account of its batch sizes (else the RL
    step's). Returns (placement, Roles)."""
    from core.placement import place

    print("effective sizes:\n" + (sizes or effective_sizes(cfg, dp_size(cfg))), flush=True)
    placement = None
    try:
        if cfg.trainer.backend == "local":  # the roles run in this process, which reads the switch now
            os.environ.update(determinism.worker_env(cfg.trainer.deterministic))
        if cfg.trainer.backend == "ray":
            env = dict(cfg.trainer.runtime_env)  # every worker runs tools with the run's isolation
            env["env_vars"] = {**env.get("env_vars", {}), isolation.ENV: cfg.tools.isolation,
                               **determinism.worker_env(cfg.trainer.deterministic)}
            init_ray(cfg.trainer.ray_address, env)
        placement = place(cfg.placement, role_specs(cfg), cfg.trainer.backend, cfg.trainer.call_timeout_s,
                          cfg.trainer.node_loss_timeout_s)
        where = placement.where()
        if where:
            print(f"placement: {where}", flush=True)
        rollout = placement["rollout"]
        if cfg.trainer.backend == "ray" and list(rollout.group.specs) == ["rollout"]:
            # on a pool of its own its replicas share nothing: one lost is dropped and its work goes to the others
            rollout = RolloutReplicas(rollout, cfg.rollout.min_replicas, log=tqdm.write)
        roles = Roles(actor=placement["actor"], rollout=rollout,
                      ref=placement["ref"] if "ref" in placement else None,
                      critic=placement["critic"] if "critic" in placement else None,
                      reward_model=placement["reward_model"] if "reward_model" in placement else None,
                      prm=placement["prm"] if "prm" in placement else None,
                      teacher=placement["teacher"] if "teacher" in placement else None)
        if cfg.trainer.backend == "ray" and (cfg.trainer.save_freq or cfg.trainer.resume_mode != "disable"):
            check_shared_output(Path(cfg.trainer.output_dir), roles)  # before step 1, not at the first save
    except BaseException:
        for tracker in trackers:
            tracker.close()
        if placement is not None:
            placement.shutdown()
        raise
    return placement, roles


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
