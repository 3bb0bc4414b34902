"""core.rollout.reaper: an engine's helper processes die with their owner, also when the owner is SIGKILLed (real
processes: an owner that starts two ``sleep`` children and a watcher, then is killed)."""

import os
import signal
import subprocess
import sys
import time

import psutil

OWNER = """
import subprocess, sys, time
from core.rollout import reaper
kids = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
watcher = reaper.watch([k.pid for k in kids])
print(" ".join(str(k.pid) for k in kids), flush=True)
if sys.argv[1] == "clean":
    reaper.stop(watcher)
    print("stopped", flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def start_owner(mode: str) -> tuple[subprocess.Popen, list[int]]:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, mode], stdout=subprocess.PIPE, text=True)
    kids = [int(p) for p in owner.stdout.readline().split()]
    assert len(kids) == 2 and all(alive(k) for k in kids)
    return owner, kids


def wait_until(check, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.1)
    return check()


def kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_owners_children_die_when_it_is_sigkilled():
    owner, kids = start_owner("watch")
    owner.kill()  # SIGKILL: no Python runs in the owner
    owner.wait()
    try:
        assert wait_until(lambda: not any(alive(k) for k in kids)), [k for k in kids if alive(k)]
    finally:
        kill(kids)


def test_a_stopped_watcher_kills_nothing():
    owner, kids = start_owner("clean")
    assert owner.stdout.readline().strip() == "stopped"
    owner.kill()
    owner.wait()
    time.sleep(1.5)  # three of the watcher's polls, had it still been running
    try:
        assert all(alive(k) for k in kids)
    finally:
        kill(kids)
