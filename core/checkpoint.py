"""Checkpoints of a run: written atomically, found again on resume, the last k kept.

Layout under ``<output_dir>/checkpoints/``::

    step_000004/
        actor/            the actor's model + optimizer state, torch.distributed.checkpoint (DCP) shards of
                          every rank, plus scheduler.pt and rng_rank<r>.pt (torch, numpy, python RNG per rank)
        trainer.json      the driver's state: step, prompt-stream position, the validation rows so far
        rollout_ahead.pt  one-step-off runs (core/one_step_off.py): the next step's samples, generated ahead
        rollout_stream.pt streaming runs (core/streaming.py): the buffer, the groups in flight, their tokens and
                          versions on every rollout rank
    latest                the name of the newest complete checkpoint ("step_000004")

A save writes ``.step_000004.tmp`` first, renames it to ``step_000004`` once every rank and the driver are done,
and only then replaces ``latest`` (write + ``os.replace``). A crash at any point leaves ``latest`` naming the
previous complete checkpoint, which is what resume reads; a left-over ``.tmp`` folder is removed by the next save.

Every rank writes its own shards, so on several machines ``output_dir`` must be storage that all of them mount at
the same path (NFS, Lustre, a bucket mount). ``write_probe`` / ``answer_probe`` / ``check_probes`` prove it before
the first step (each rank reads the driver's file and writes one back that the driver must see), and ``commit``
refuses a checkpoint in which a rank's files are missing.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

LATEST = "latest"


def checkpoint_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def step_name(step: int) -> str:
    return f"step_{step:06d}"


def begin(output_dir: str | Path, step: int) -> Path:
    """A fresh temporary folder for the checkpoint of ``step`` (stale temporaries of crashed saves removed)."""
    root = checkpoint_dir(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".step_*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".{step_name(step)}.tmp"
    tmp.mkdir()
    return tmp


def commit(tmp: Path, driver_state: dict, keep: int, world_sizes: dict[str, int] | None = None) -> Path:
    """Write the driver's state, make the checkpoint visible (rename, then ``latest``), drop all but the last
    ``keep`` (0 = keep all). Returns the final folder. ``world_sizes`` (role -> ranks that saved under
    ``tmp/<role>``): every rank's RNG file must be there, else nothing is committed and ``latest`` stays."""
    for role, n in (world_sizes or {}).items():
        missing = [r for r in range(n) if not (tmp / role / f"rng_rank{r}.pt").is_file()]
        if missing:
            raise FileNotFoundError(
                f"checkpoint {tmp}: the files of {role} rank(s) {missing} are not there on the driver's machine, so "
                f"it was not committed ('latest' still names the previous one). {SHARED_STORAGE}")
    write_atomic(tmp / "trainer.json", json.dumps(driver_state, indent=1))
    final = tmp.parent / tmp.name[1:].removesuffix(".tmp")
    if final.exists():  # a checkpoint of this step from an earlier run that was resumed from before it
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(tmp.parent)
    write_atomic(tmp.parent / LATEST, final.name)
    if keep > 0:
        for old in sorted(tmp.parent.glob("step_*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def find(output_dir: str | Path, mode: str) -> Path | None:
    """The checkpoint to resume from: ``auto`` = the run's ``latest`` if there is one, ``disable`` = none,
    anything else = that path (an error naming it when it is not a complete checkpoint)."""
    if mode == "disable":
        return None
    if mode == "auto":
        pointer = checkpoint_dir(output_dir) / LATEST
        if not pointer.is_file():
            return None
        path = pointer.parent / pointer.read_text().strip()
    else:
        path = Path(mode)
    if not (path / "trainer.json").is_file() or not (path / "actor").is_dir():
        raise FileNotFoundError(f"trainer.resume_mode: {path} is not a complete checkpoint "
                                f"(needs trainer.json and actor/)")
    return path


SHARED_STORAGE = ("Every rank writes its own checkpoint shards under trainer.output_dir and a resume reads all of "
                  "them: on several machines it must be storage that every node mounts at the same path (NFS, "
                  "Lustre, a bucket mount), not a node's local disk.")


def write_probe(output_dir: str | Path) -> tuple[Path, str]:
    """The driver's half of the shared-storage check: a fresh folder holding a file ``driver`` with a random
    token. Returns (folder, token)."""
    import uuid

    folder = checkpoint_dir(output_dir) / ".probe"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    token = uuid.uuid4().hex
    write_atomic(folder / "driver", token)
    return folder, token


def answer_probe(folder: str, token: str, name: str) -> str:
    """A rank's half, run in the worker: read the driver's token, write it back as ``<folder>/<name>``.
    Returns "" or what went wrong, as seen from this rank's machine."""
    from core.worker import node_ip

    where = f"{name} on node {node_ip()} ({os.uname().nodename})"
    try:
        seen = (Path(folder) / "driver").read_text()
    except OSError as e:
        return f"{where} cannot read {folder}/driver, which the driver wrote ({type(e).__name__})"
    if seen != token:
        return f"{where} reads another run's {folder}/driver"
    try:
        write_atomic(Path(folder) / name, token)
    except OSError as e:
        return f"{where} cannot write into {folder} ({e})"
    return ""


def check_probes(folder: Path, token: str, names: list[str], answers: list[str]) -> None:
    """The driver's verdict: every rank read the token, and each rank's answer file is visible here."""
    problems = [a for a in answers if a]
    for name in names:
        path = folder / name
        if not problems and (not path.is_file() or path.read_text() != token):
            problems.append(f"the driver cannot see {path}, which {name} wrote")
    shutil.rmtree(folder, ignore_errors=True)
    if problems:
        raise RuntimeError(f"trainer.output_dir={folder.parent.parent} is not shared by every rank: "
                           + "; ".join(problems) + f". {SHARED_STORAGE}")


def driver_state(path: Path) -> dict:
    return json.loads((path / "trainer.json").read_text())


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file, fsync and ``os.replace``: readers see the old or the new file."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state() -> dict:
    """This process's RNG states: torch (CPU and, when present, CUDA), numpy, python."""
    import random

    import numpy as np
    import torch

    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    import random

    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
