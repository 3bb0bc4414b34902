"""What a run keeps across stops: a checkpoint of every trained role and of the driver (``save``), the resume from
one (``resume``), ``metrics.jsonl`` rewound to it or set aside for a fresh run, and what a stopped run says."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from core import checkpoint
from core.config import RunConfig
from core.data.prompt_stream import PromptStream
from core.loop import Roles, sync_rollout
from core.train.critic import ValueWorker
from core.train.policy import PolicyWorker
from core.worker_group import RoleGroup, WorkerError


def resume(cfg: RunConfig, out: Path, roles: Roles, stream: PromptStream, kl_ctrl) -> tuple[int, list[dict]]:
    """The checkpoint ``trainer.resume_mode`` names, if any, restored: weights, optimizer, RNG, the prompt stream's
    position, the KL controller, a one-step-off run's samples generated ahead, a streaming run's stream; the engine
    synced, metrics.jsonl
    rewound. Else a fresh start (an earlier run's metrics moved aside). Returns (first step, metrics so far)."""
    resumed = checkpoint.find(out, cfg.trainer.resume_mode)
    if resumed is None:  # a fresh run starts a fresh file: appending would mix two runs in one history and report
        set_aside_metrics(out / "metrics.jsonl")
        return 0, []
    state = checkpoint.driver_state(resumed)
    for name, group, worker in trained_roles(roles):
        group.call_all(worker.load_checkpoint, str(resumed / name))
    synced = sync_rollout(roles, cfg.algo.sync_timeout_s)  # fresh engines: a full sync
    stream.restore(state["stream"])
    if roles.ahead is not None:
        roles.ahead.restore(resumed, state["step"])
    if roles.stream is not None:
        roles.stream.restore(resumed)
    if kl_ctrl is not None:
        kl_ctrl.load_state_dict(state["kl_ctrl"])
    print(f"resumed from {resumed} (step {state['step']}); rollout weights synced "
          f"{'in full' if synced.get('sync/full', 1.0) else 'as a delta'} ({synced['sync/megabytes']:.1f} MB)", flush=True)
    return state["step"], rewind_metrics(out / "metrics.jsonl", state["step"])


def save(out: Path, step_no: int, roles: Roles, stream: PromptStream, kl_ctrl, cfg: RunConfig, keep: int) -> None:
    """A checkpoint after ``step_no``: every saving rank's shards, then the driver's state, committed atomically;
    the newest ``keep`` checkpoints stay (trainer.save_keep; 0 = all)."""
    tmp = checkpoint.begin(out, step_no)
    for name, group, worker in trained_roles(roles):
        group.call_all(worker.save_checkpoint, str(tmp / name))
    state = {"step": step_no, "stream": stream.state(), "model": cfg.actor.model}
    if cfg.actor.lora.rank:  # export rebuilds the adapted model from it
        state["lora"] = asdict(cfg.actor.lora)
    if kl_ctrl is not None:
        state["kl_ctrl"] = kl_ctrl.state_dict()
    if roles.ahead is not None:  # one step off: the next step's samples, already generated
        roles.ahead.save(tmp)
    if roles.stream is not None:  # streaming: the buffer, the sequences in flight and their versions
        roles.stream.save(tmp)
    checkpoint.commit(tmp, state, keep, saved_ranks(roles))


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


class RunStopped(RuntimeError):
    """A run stopped by a worker failure; the message names the failure and the checkpoint to resume from."""


def stopped_message(out: Path, e: WorkerError) -> str:
    """What failed (role, rank, node: the error's first line) and where the run can go on from."""
    last = checkpoint.find(out, "auto")
    resume = (f"the last checkpoint is {last} (intact: checkpoints are committed whole). Bring the lost worker or node "
              f"back (ray status) and run the same command again: trainer.resume_mode=auto (the default) resumes from "
              f"it" if last is not None else "no checkpoint was saved (trainer.save_freq): a rerun starts from step 0")
    return f"the run stopped: {str(e).splitlines()[0]}\n{resume}"
