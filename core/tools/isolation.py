"""Where a tool process runs: in namespaces of its own (``tools.isolation: namespaces``, the default) or as a plain
limited process (``process``: rlimits and seccomp only, the tool sees every file the worker can read).

Namespaces are made by bubblewrap (``bwrap``, Debian's ``bubblewrap``), per call:
  * mount: a fresh root holding only ``/usr`` (with the ``/bin``, ``/lib`` links), the Python prefix and the
    environment the tool's interpreter runs from, all read-only, and ``/proc``, a minimal ``/dev``, and size-capped
    tmpfs for ``/tmp``, ``/dev/shm`` and the working directory ``/scratch`` (the tool's code is bound read-only
    into it) -- not the run's outputs, data, checkpoints, the project's code, ``~/.ray`` or ``/etc``;
  * PID (``/proc`` shows the sandbox's processes only), network (loopback only), IPC, UTS and cgroup;
  * the tool's uid is not the worker's: a root worker's tool runs as ``nobody`` (uid 65534) -- a real uid, so
    ``/proc/<pid>/status`` outside says 65534 and no root-owned file is readable by it -- with every capability
    dropped and ``no_new_privs``, then in a user namespace of its own mapping 65534 to 65534 (root makes the other
    namespaces; a user namespace made by root would map the tool to root outside). A worker that is not root makes
    them all in a user namespace, which maps the tool to the worker's own uid (it has no other);
  * cgroup limits of memory and pids where the worker may make cgroups (v1 or v2, under its own cgroup);
  * its own session, and killed with the worker (``--die-with-parent``).
Inside, ``core.tools.sandbox_launch`` adds the rlimits and the seccomp filter (``core.tools.seccomp``).

Where namespaces cannot be made (no ``bwrap``, user namespaces off), a tool call refuses: ``refusal`` names what
allows it, never a silent downgrade.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

MODES = ("namespaces", "process")
ENV = "HYBRIDRL_TOOLS_ISOLATION"  # the run's tools.isolation, set by the driver for every worker
TOOL_UID = 65534                  # nobody
TMP_BYTES = 64 << 20              # each of /tmp, /dev/shm and /scratch
PIDS_MAX = 64


class SandboxUnavailable(RuntimeError):
    """Namespaces were asked for (``tools.isolation: namespaces``) and cannot be made here."""


def mode() -> str:
    """The run's isolation: ``tools.isolation`` as the driver passed it, else the default ``namespaces``."""
    value = os.environ.get(ENV, "namespaces")
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r}: tools.isolation must be one of {MODES}")
    return value


@functools.cache
def real_root() -> bool:
    """Root of the machine (not a container's root mapped to another uid): it can switch the tool to ``TOOL_UID``."""
    try:
        ident = open("/proc/self/uid_map").read().split() == ["0", "0", "4294967295"]
    except OSError:
        ident = False
    return os.geteuid() == 0 and ident


def _python_roots() -> list[str]:
    """What the tool's interpreter needs besides /usr: the Python prefix and the environment it runs from."""
    roots = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, os.path.dirname(sys.executable))}
    roots = {r for r in roots if not r.startswith("/usr/")}
    return sorted(r for r in roots if not any(r != o and r.startswith(o + "/") for o in roots))


def interpreter() -> str:
    """This Python's path with its folder's links resolved, as the tool runs it: the sandbox binds the resolved
    roots (``_python_roots``), and a venv's ``bin/python`` must keep its folder to find its ``pyvenv.cfg``."""
    return os.path.join(os.path.realpath(os.path.dirname(sys.executable)), os.path.basename(sys.executable))


def _dirs(paths: list[str]) -> list[str]:
    """``--dir`` for every ancestor of the bound paths, world-searchable (bwrap would make them 0700)."""
    out, seen = [], set()
    for path in paths:
        parts = path.strip("/").split("/")[:-1]
        for i in range(len(parts)):
            d = "/" + "/".join(parts[:i + 1])
            if d not in seen:
                seen.add(d)
                out += ["--perms", "0755", "--dir", d]
    return out


def bwrap_args(code_dir: str) -> list[str]:
    """The bubblewrap command line up to ``--`` (the tool's argv follows): ``code_dir`` (on the host) is seen
    read-only as ``/scratch/.code`` and the working directory ``/scratch`` is a fresh tmpfs."""
    root = real_root()
    roots = _python_roots()
    args = [shutil.which("bwrap") or "bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if root:  # setpriv inside drops to TOOL_UID: it needs these two, gone with the uid change
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    else:
        args += ["--unshare-user"]
    args += ["--ro-bind", "/usr", "/usr"]
    args += [a for link in ("bin", "lib", "lib64", "sbin") if os.path.islink(f"/{link}")
             for a in ("--symlink", os.readlink(f"/{link}"), f"/{link}")]
    args += ["--proc", "/proc", "--dev", "/dev"]
    for path in ("/tmp", "/dev/shm", "/scratch"):  # /dev/shm over --dev's own
        args += ["--size", str(TMP_BYTES), "--perms", "1777", "--tmpfs", path]
    args += _dirs(roots)  # after the tmpfs mounts: an environment under /tmp (a CI runner's) stays visible
    for r in roots:
        args += ["--ro-bind", r, r]
    args += ["--ro-bind", code_dir, "/scratch/.code", "--chdir", "/scratch", "--setenv", "HOME", "/scratch"]
    return args + ["--"]


def drop_uid() -> list[str]:
    """The argv prefix that runs the tool as ``TOOL_UID`` with no capabilities, in a user namespace of its own that
    maps it to ``TOOL_UID`` outside (a root worker: an unprivileged bwrap inside the sandbox), else nothing."""
    if not real_root():
        return []
    return ["/usr/bin/setpriv", f"--reuid={TOOL_UID}", f"--regid={TOOL_UID}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs", "--", shutil.which("bwrap") or "bwrap", "--unshare-user",
            "--uid", str(TOOL_UID), "--gid", str(TOOL_UID), "--bind", "/", "/", "--die-with-parent", "--"]


@functools.cache
def probe() -> str | None:
    """None when a namespaced tool can run on this host; else why not, in one line (bwrap's own message)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    if real_root() and not os.path.exists("/usr/bin/setpriv"):
        return "setpriv (util-linux) is not installed"
    empty = os.path.dirname(os.path.abspath(__file__))
    try:
        r = subprocess.run(bwrap_args(empty) + drop_uid() + ["/bin/true"], capture_output=True, text=True,
                           timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap did not start: {e}"
    if r.returncode != 0:
        lines = (r.stderr or r.stdout).strip().splitlines()
        return lines[-1] if lines else f"bwrap exited with {r.returncode}"
    return None


def refusal(reason: str) -> str:
    return (f"tools.isolation: namespaces, but they cannot be made on this host ({reason}). Install bubblewrap "
            f"(apt-get install bubblewrap) and allow user namespaces (sysctl user.max_user_namespaces > 0 and "
            f"kernel.unprivileged_userns_clone=1; a container needs a runtime or seccomp profile that permits them), "
            f"or set tools.isolation: process to run tools with rlimits and seccomp only -- the tool then reads "
            f"every file the worker can")


def describe(isolation: str) -> str:
    """One line for ``hybridrl plan``: the isolation a run's tools will get on this host."""
    if isolation == "process":
        return "process (rlimits + seccomp; the tool reads every file the worker can)"
    why = probe()
    if why:
        return f"namespaces REFUSED here: {why} (tools.isolation: process runs them without)"
    who = f"uid {TOOL_UID}" if real_root() else "the worker's uid"
    cg = ", cgroup " + "+".join(sorted(Cgroup.paths())) if Cgroup.paths() else ", no cgroup (none writable)"
    return f"namespaces (bubblewrap: user/mount/pid/net/ipc/uts, {who}{cg}) + seccomp + rlimits"


class Cgroup:
    """A cgroup per tool call under the worker's own (memory and pids limits), v1 or v2; none where the worker may
    not make one. ``enter`` is a shell prefix that moves the process into it before it execs the sandbox."""

    LIMITS = {"memory": ("memory.limit_in_bytes", "memory.max"), "pids": ("pids.max", "pids.max")}

    @staticmethod
    @functools.cache
    def paths() -> dict[str, tuple[str, bool]]:
        """controller -> (the worker's cgroup folder, is v2) where a child can be made and limited."""
        found: dict[str, tuple[str, bool]] = {}
        try:
            lines = open("/proc/self/cgroup").read().splitlines()
        except OSError:
            return {}
        for line in lines:
            _, ctrls, path = line.split(":", 2)
            for ctrl in Cgroup.LIMITS:
                if ctrls == "":  # v2: the controller must be enabled for children
                    base = f"/sys/fs/cgroup{path.rstrip('/')}"
                    try:
                        ok = ctrl in open(f"{base}/cgroup.subtree_control").read().split()
                    except OSError:
                        ok = False
                    if ok and os.access(base, os.W_OK) and ctrl not in found:
                        found[ctrl] = (base, True)
                elif ctrl in ctrls.split(","):
                    base = f"/sys/fs/cgroup/{ctrl}{path.rstrip('/')}"
                    if os.access(base, os.W_OK):
                        found[ctrl] = (base, False)
        return found

    def __init__(self, memory_bytes: int):
        self.dirs: list[str] = []
        for ctrl, (base, v2) in self.paths().items():
            d = f"{base}/hybridrl-tool-{uuid.uuid4().hex[:12]}"
            value = memory_bytes + 3 * TMP_BYTES if ctrl == "memory" else PIDS_MAX  # tmpfs pages count too
            try:
                os.mkdir(d)
            except OSError:
                continue
            self.dirs.append(d)
            try:
                with open(f"{d}/{self.LIMITS[ctrl][v2]}", "w") as f:
                    f.write(str(value))
            except OSError:
                self.close()
                self.dirs = []
                return

    def enter(self) -> list[str]:
        if not self.dirs:
            return []
        moves = "; ".join(f"echo $$ > {d}/cgroup.procs" for d in self.dirs)
        return ["/bin/sh", "-c", f'{moves} && exec "$@"', "sh"]

    def close(self) -> None:
        """Kill what is left in it (threads of a killed tool) and remove it."""
        for d in self.dirs:
            try:
                for pid in open(f"{d}/cgroup.procs").read().split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            except OSError:
                pass
        for d in self.dirs:
            for _ in range(200):  # the killed processes leave it within milliseconds
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.005)
