"""Ends an engine's helper processes when the process that owns them dies without shutting them down.

vLLM on CPU runs its engine core and worker in processes of its own. ``shutdown()`` ends them, but a rank that is
SIGKILLed (Ray killing a failed actor, the OOM killer, ``kill -9``) runs no Python: the engine's processes then
outlived it, holding their memory and their cores (seen: both still running 20 s after their owner's SIGKILL).
``watch(pids)`` starts a small process that waits for its parent (the owner) to die and then kills ``pids``.

    python -m core.rollout.reaper <owner pid> <pid> [<pid> ...]    # what ``watch`` runs; polls every 0.5 s
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def watch(pids: list[int]) -> subprocess.Popen | None:
    """Kill ``pids`` once this process is gone. Returns the watcher (``stop`` it on a clean shutdown)."""
    if not pids:
        return None
    return subprocess.Popen([sys.executable, "-m", "core.rollout.reaper", str(os.getpid()), *map(str, pids)],
                            stdin=subprocess.DEVNULL, start_new_session=True)  # not in the owner's process group


def stop(watcher: subprocess.Popen | None) -> None:
    if watcher is not None and watcher.poll() is None:
        watcher.terminate()
        watcher.wait(timeout=10)


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat: tells a process from a later one that reuses its pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def main(argv: list[str]) -> None:
    owner, targets = int(argv[0]), {int(p): _start_time(int(p)) for p in argv[1:]}
    # reparented (to init or a subreaper) once the owner has died; the owner's pid comes as an argument because it
    # may die before this process has started (it then kills at once)
    while os.getppid() == owner:
        time.sleep(0.5)
    for pid, started in targets.items():
        if started is not None and _start_time(pid) == started:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    main(sys.argv[1:])
