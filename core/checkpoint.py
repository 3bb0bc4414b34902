"""Checkpoints of a run: written atomically, found again on resume, the last k kept.

Layout under ``<output_dir>/checkpoints/``::

    step_000004/
        actor/            the actor's model + optimizer state, torch.distributed.checkpoint (DCP) shards of
                          every rank, plus scheduler.pt and rng_rank<r>.pt (torch, numpy, python RNG per rank)
        trainer.json      the driver's state: step, prompt-stream position, the validation rows so far
    latest                the name of the newest complete checkpoint ("step_000004")

A save writes ``.step_000004.tmp`` first, renames it to ``step_000004`` once every rank and the driver are done,
and only then replaces ``latest`` (write + ``os.replace``). A crash at any point leaves ``latest`` naming the
previous complete checkpoint, which is what resume reads; a left-over ``.tmp`` folder is removed by the next save.
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


def commit(tmp: Path, driver_state: dict, keep: int) -> Path:
    """Write the driver's state, make the checkpoint visible (rename, then ``latest``), drop all but the last
    ``keep`` (0 = keep all). Returns the final folder."""
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
