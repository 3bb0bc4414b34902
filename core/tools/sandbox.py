"""Run a tool's code in a separate, limited process: what an agent's Python or calculator call runs in, and a
code reward's tests (``core.rewards.code_tests``).

Each call is a fresh interpreter (``python -I``) in its own session, in an empty working directory, with
  * the run's isolation (``core.tools.isolation``): by default namespaces of its own -- a read-only view of only
    the interpreter, no network, no other processes, uid ``nobody``, cgroup limits; with ``tools.isolation:
    process`` only what follows. Where namespaces are asked for and cannot be made, ``SandboxUnavailable``;
  * a wall-time limit (the process group is killed: ``timeout``),
  * an address-space limit (``RLIMIT_AS``: a big allocation raises MemoryError in the tool), a CPU-time limit,
    a file-size limit, no core dumps and a bounded number of open files,
  * no new processes or programs, no network sockets, no syscall that reaches other processes, namespaces or
    mounts (``core.tools.seccomp``; where seccomp is missing the result says so in ``isolation``),
  * its output (stdout and stderr together) cut at ``max_output_bytes``: the process is killed once it has
    written that much (``output_limit``), so a flood never fills the worker's memory,
  * a minimal environment (no proxies, no tokens, one BLAS thread).
Whatever the code does, ``run_python`` returns a ``ToolResult`` whose ``text`` is what the model sees next: the
output, and a last line naming the error, timeout or truncation. It never raises for the tool's behaviour.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from core.tools import isolation as iso, seccomp


@dataclass(frozen=True)
class SandboxLimits:
    # seconds of wall time before the process is killed
    timeout_s: float = 5.0
    # bytes of address space (RLIMIT_AS); the interpreter itself needs ~50 MB, numpy ~300 MB
    memory_bytes: int = 1 << 30
    # bytes of output kept; the process is killed when it writes more
    max_output_bytes: int = 4096
    # bytes a file written in the scratch directory may grow to
    max_file_bytes: int = 16 << 20
    # open file descriptors
    max_open_files: int = 64


@dataclass(frozen=True)
class ToolResult:
    # what the model sees: the output, then a line naming any error, timeout or truncation
    text: str
    # ok | error (non-zero exit, e.g. an exception) | timeout | output_limit
    status: str
    exit_code: int | None
    seconds: float
    # what contained the process: "namespaces+seccomp+rlimits", "seccomp+rlimits" (tools.isolation: process) or
    # "rlimits" (no seccomp on this host), with "+cgroup" where a cgroup limited it
    isolation: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"


ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
       "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


HERE = os.path.dirname(os.path.abspath(__file__))


def _limits_arg(limits: SandboxLimits, use_seccomp: bool) -> str:
    """The launcher's settings (``core/tools/sandbox_launch.py``, which applies them before running the tool)."""
    return json.dumps({"memory_bytes": limits.memory_bytes, "cpu_s": max(1, int(limits.timeout_s) + 1),
                       "file_bytes": limits.max_file_bytes, "open_files": limits.max_open_files,
                       "seccomp": use_seccomp})


def run_python(code: str, limits: SandboxLimits = SandboxLimits(), stdin: str | None = None,
               isolation: str | None = None) -> ToolResult:
    """Run ``code`` as a Python script in the sandbox, ``stdin`` as its standard input; its stdout and stderr,
    merged, are the result's text. ``isolation``: namespaces | process; None: the run's (``isolation.mode()``)."""
    mode = isolation or iso.mode()
    if mode == "namespaces" and (why := iso.probe()):
        raise iso.SandboxUnavailable(iso.refusal(why))
    use_seccomp = seccomp.available()
    code_dir = tempfile.mkdtemp(prefix="hybridrl-tool-")
    os.chmod(code_dir, 0o755)  # read by the tool's uid (nobody) through the read-only bind
    cgroup = iso.Cgroup(limits.memory_bytes) if mode == "namespaces" else None
    start = time.monotonic()
    try:
        for name, text in (("main.py", code), ("stdin", stdin)):
            if text is not None:
                with open(os.path.join(code_dir, name), "w") as f:
                    f.write(text)
        for name in ("sandbox_launch.py", "seccomp.py"):
            shutil.copy(os.path.join(HERE, name), code_dir)
        if mode == "namespaces":
            where, cwd = "/scratch/.code", "/"
            argv = cgroup.enter() + iso.bwrap_args(code_dir) + iso.drop_uid() + [iso.interpreter()]
        else:
            where, cwd = code_dir, tempfile.mkdtemp(prefix="hybridrl-tool-", dir=code_dir)
            argv = [sys.executable]
        argv += ["-I", f"{where}/sandbox_launch.py", _limits_arg(limits, use_seccomp),
                 f"{where}/main.py"]
        # no preexec_fn: Python between fork and exec in a threaded caller can deadlock (sandbox_launch.py)
        proc = subprocess.Popen(argv, cwd=cwd, env=dict(ENV, HOME="/scratch" if mode == "namespaces" else cwd),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        out, status = _collect(proc, limits, start)
    finally:
        if cgroup is not None:
            cgroup.close()
        shutil.rmtree(code_dir, ignore_errors=True)
    seconds = time.monotonic() - start
    text = out.decode("utf-8", errors="replace")
    code_ = proc.returncode
    if status == "ok" and code_ != 0:
        status = "error"
    note = {"timeout": f"[tool timed out after {limits.timeout_s:g} s]",
            "output_limit": f"[tool output truncated at {limits.max_output_bytes} bytes; the tool was stopped]",
            "error": f"[tool exited with code {code_}]" if code_ is not None and code_ >= 0
            else f"[tool killed by signal {-code_ if code_ is not None else '?'}]"}.get(status)
    if note:
        text = (text + ("\n" if text and not text.endswith("\n") else "") + note)
    layers = (["namespaces"] if mode == "namespaces" else []) + (["seccomp"] if use_seccomp else []) + ["rlimits"] \
        + (["cgroup"] if cgroup is not None and cgroup.dirs else [])
    return ToolResult(text, status, code_, seconds, "+".join(layers))


def _collect(proc: subprocess.Popen, limits: SandboxLimits, start: float) -> tuple[bytes, str]:
    """Read the merged output until EOF, the byte limit or the deadline, then wait out the deadline for the exit;
    the process group is killed whenever the process is still there (a timeout, a flood, or any error here)."""
    fd, chunks, size, status = proc.stdout.fileno(), [], 0, "ok"
    deadline = start + limits.timeout_s
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                status = "timeout"
                break
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            if not ready:
                continue
            data = os.read(fd, 65536)
            if not data:
                break
            chunks.append(data)
            size += len(data)
            if size > limits.max_output_bytes:
                status = "output_limit"
                break
        if status == "ok":  # output closed: the exit must still come before the deadline
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                status = "timeout"
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        proc.stdout.close()
    return b"".join(chunks)[:limits.max_output_bytes], status
