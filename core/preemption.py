"""Preemption: SIGTERM or SIGUSR1 to the driver ends the run at a step boundary with a checkpoint, not a crash.

Schedulers warn before they kill: SLURM sends SIGTERM (``scancel``, a preempting job; SIGUSR1 ahead of the time
limit with ``#SBATCH --signal=USR1@<s>``) and waits ``KillWait`` (30 s by default) before SIGKILL; Kubernetes and
``ray job stop`` do the same. On the signal the driver lets the step in progress finish, writes a checkpoint,
closes its trackers and exits with ``EXIT_PREEMPTED`` (75): requeue me. ``trainer.resume_mode: auto`` (the default)
resumes from that checkpoint when the same command runs again. A step that would not end within
``trainer.preempt_deadline_s`` is abandoned: the run exits at once, to resume from the checkpoint before it.

Worker processes ignore SIGTERM (a scheduler signals every process of a job, and a worker that died first would turn
the driver's orderly stop into a crash): the driver stops them when the run ends.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped on request, resumable -- a wrapper requeues the job on it
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preempted(RuntimeError):
    """The run stopped on a scheduler's signal; the message says at which step and what resumes it."""


class PreemptionWatch:
    """While entered (in the main thread): SIGTERM / SIGUSR1 set ``requested``; ``deadline_s`` later, a step still
    running is interrupted (SIGINT: KeyboardInterrupt in the main thread, which the loop turns into ``Preempted``)."""

    def __init__(self, deadline_s: float):
        self.deadline_s, self.requested, self.step_done = deadline_s, None, threading.Event()
        self._old: dict = {}

    def __enter__(self) -> "PreemptionWatch":
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._on_signal) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self.step_done.set()

    def _on_signal(self, signum: int, frame) -> None:
        if self.requested is not None:
            return
        self.requested = signal.Signals(signum).name
        print(f"\n{self.requested}: finishing the step in progress (at most trainer.preempt_deadline_s="
              f"{self.deadline_s:g}s), then a checkpoint and exit {EXIT_PREEMPTED}", file=sys.stderr, flush=True)
        threading.Thread(target=self._deadline, daemon=True).start()

    def _deadline(self) -> None:
        if not self.step_done.wait(self.deadline_s):  # the step is abandoned; the last checkpoint stands
            os.kill(os.getpid(), signal.SIGINT)  # a real signal: it also ends a wait the main thread is blocked in

    def step_ended(self) -> None:
        """A step boundary: the deadline no longer applies once the run acts on the request here."""
        if self.requested is not None:
            self.step_done.set()


def ignore_sigterm_in_worker() -> None:
    """A worker process outlives a scheduler's SIGTERM: the driver ends the run (checkpoint first) and stops it.
    Ignored outright (no handler): a handler's signal would also interrupt the system call it lands in, and a
    collective's interrupted recv fails the step. Ray stops its workers with SIGKILL when a run ends."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

