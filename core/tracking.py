"""Experiment trackers: ``trainer.logger=[console,jsonl,tensorboard,swanlab,wandb]``.

``<output_dir>/metrics.jsonl`` is always written (resume and the end-of-run report read it), so ``jsonl`` is
accepted and changes nothing. ``console`` prints one line per step. The others write under ``<output_dir>``:
``tensorboard/`` (event files), ``swanlab/`` and ``wandb/``, offline by default (``trainer.tracker_mode``:
``offline`` keeps everything on the local host; ``online`` uploads, with the tool's own login). Every tracker is
created before the first step, so a missing package fails at start with the pip command, not deep in a run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Protocol

NAMES = ("console", "jsonl", "tensorboard", "swanlab", "wandb")


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class Console:
    """One line per step: the keys most people watch, then the validation score when there is one."""

    def __init__(self, write: Callable[[str], None] = print):
        self.write = write

    def log(self, metrics: dict[str, float], step: int) -> None:
        if "reward/mean" not in metrics:  # a validation-only row (step 0)
            if "val/reward/mean" in metrics:
                self.write(f"step {step}: val reward {metrics['val/reward/mean']:.3f}")
            return
        self.write(f"step {step}: reward {metrics['reward/mean']:.3f} | len {metrics['response_length/mean']:.0f}"
                   f" | pg_loss {metrics['actor/pg_loss']:.4f} | kl {metrics['actor/kl_loss']:.4f}"
                   + (f" | vf_loss {metrics['critic/vf_loss']:.4f}" if "critic/vf_loss" in metrics else "")
                   + (f" | ev {metrics['critic/explained_var']:.3f}" if "critic/explained_var" in metrics else "")
                   + (f" | kl to teacher {metrics['distill/reverse_kl']:.4f}" if "distill/reverse_kl" in metrics else "")
                   + f" | {metrics['timing_s/step']:.1f}s"
                   + (f" | val {metrics['val/reward/mean']:.3f}" if "val/reward/mean" in metrics else ""))

    def close(self) -> None:
        pass


class TensorBoard:
    def __init__(self, out: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(out / "tensorboard"))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in _numbers(metrics).items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class SwanLab:
    def __init__(self, out: Path, project: str, name: str, config: dict, mode: str):
        import swanlab

        self.swanlab = swanlab
        self.run = swanlab.init(project=project, name=name, config=config, log_dir=str(out / "swanlab"),
                                mode="local" if mode == "offline" else "online")

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.swanlab.log(_numbers(metrics), step=step)

    def close(self) -> None:
        self.swanlab.finish()


class WandB:
    def __init__(self, out: Path, project: str, name: str, config: dict, mode: str):
        import wandb

        self.run = wandb.init(project=project, name=name, config=config, dir=str(out), mode=mode)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(_numbers(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


PACKAGES = {"tensorboard": "tensorboard", "swanlab": "swanlab", "wandb": "wandb"}


def make_trackers(names: list[str], out: Path, project: str, name: str, config: dict, mode: str = "offline",
                  write: Callable[[str], None] = print) -> list[Tracker]:
    """The trackers named in ``trainer.logger``; an unknown name or a missing package is a ValueError that says so."""
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        raise ValueError(f"trainer.logger: unknown tracker(s) {unknown}; known: {list(NAMES)}")
    made: list[Tracker] = []
    for n in dict.fromkeys(names):  # in order, once each
        try:
            if n == "console":
                made.append(Console(write))
            elif n == "tensorboard":
                made.append(TensorBoard(out))
            elif n == "swanlab":
                made.append(SwanLab(out, project, name, config, mode))
            elif n == "wandb":
                made.append(WandB(out, project, name, config, mode))
        except ImportError as e:
            for t in made:
                t.close()
            raise ValueError(f"trainer.logger includes {n!r} but {PACKAGES[n]!r} is not importable ({e}); "
                             f"pip install {PACKAGES[n]}, or drop {n!r} from trainer.logger") from None
    return made


def _numbers(metrics: dict) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class MetricsLog:
    """``<output_dir>/metrics.jsonl``, one JSON line per step appended and flushed as it comes (a step that stops the
    run loses nothing of the ones before), the history so far (a resumed run's included) and the trackers."""

    def __init__(self, path: Path, history: list[dict], trackers: list[Tracker]):
        self.file, self.history, self.trackers = path.open("a"), history, trackers

    def record(self, metrics: dict) -> None:
        self.file.write(json.dumps(metrics) + "\n")
        self.file.flush()
        self.history.append(metrics)
        for tracker in self.trackers:
            tracker.log(metrics, metrics["step"])

    def __enter__(self) -> "MetricsLog":
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()
