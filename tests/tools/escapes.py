"""The sandbox escape suite's cases, shared by tests/tools/test_escapes.py (every case contained with namespaces)
and bench/sandbox_escape_table.py (the table: each case with ``tools.isolation: process`` and with namespaces).

A case is a tool program that tries one way out; ``Targets`` plants what it aims at: canary strings in an output
folder, a checkpoint, a data file of ground truths and a ``~/.ray`` token; a decoy "worker" process (same uid as
this one) holding a canary in its environment; a listening TCP, UDP, AF_UNIX and abstract socket; host paths a
write must not reach. ``judge`` calls a case escaped when a canary or the marker ``ESCAPED`` is in the tool's
output, a watched host path changed, or the decoy died. The programs print ``ESCAPED`` only after an attempt
succeeded, and nothing else the judge reads.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
CANARY = f"CANARY-{uuid.uuid4().hex}"
LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"


def _try(body: str, what: str | None = "it") -> str:
    """A program: run ``body``; ESCAPED when it does not raise (``what`` None: the host's state tells, as for a
    write that may land on the sandbox's own tmpfs)."""
    indented = "\n".join("    " + line for line in body.strip().splitlines())
    ok = f"\n    print('ESCAPED: {what}')" if what else "\n    print('wrote (somewhere)')"
    return f"try:\n{indented}{ok}\nexcept BaseException as e:\n    print('failed:', type(e).__name__)\n"


def _rc(call: str) -> str:
    """A program: a libc call; ESCAPED when it returns 0 (or a valid fd)."""
    return LIBC + f"r = {call}\nprint('ESCAPED' if r >= 0 else f'failed: errno {{{{ctypes.get_errno()}}}}')\n"


@dataclass(frozen=True)
class Case:
    name: str
    group: str
    code: str                      # a str.format template over Targets.fields()
    timeout_s: float = 3.0


def _read(path: str) -> str:
    return _try(f"print(open({path}, errors='replace').read(300))", "read")


CASES = [
    # read: each target holds the canary
    Case("read the run's output_dir", "read", _read("'{out_dir}/metrics.jsonl'")),
    Case("read a checkpoint", "read", _read("'{out_dir}/checkpoint/model.pt'")),
    Case("read the data file's ground truths", "read", _read("'{data_file}'")),
    Case("read ~/.ray (a planted auth_token)", "read", _read("'{home}/.ray/auth_token'")),
    Case("list the worker's real ~/.ray", "read", _try("print(os.listdir(os.path.expanduser('~root/.ray')))")
         .replace("try:", "import os\ntry:", 1)),
    Case("read /etc/shadow", "read", _read("'/etc/shadow'")),
    Case("read /proc/1/environ", "read", _read("'/proc/1/environ'")),
    Case("read the worker's /proc/<pid>/environ", "read", _read("'/proc/{decoy}/environ'")),
    Case("read the worker's memory (/proc/<pid>/mem)", "read", _try(
        "st = open('/proc/{decoy}/stat').read().rsplit(')', 1)[1].split()\n"
        "start, end = int(st[-5]), int(st[-4])\n"
        "with open('/proc/{decoy}/mem', 'rb') as f:\n    f.seek(start)\n    print(f.read(end - start))", "read mem")),
    Case("read the project's core/rewards/*.py", "read", _read("'{project}/core/rewards/math_answer.py'")),
    # write: each target is watched
    Case("write a file in output_dir", "write", _try("open('{out_dir}/planted.txt', 'w').write('x')", None)),
    Case("overwrite the data file", "write", _try("open('{data_file}', 'a').write('tampered')", None)),
    Case("write in the project tree", "write", _try("open('{project}/{planted}', 'w').write('x')", None)),
    Case("write in /tmp outside the scratch dir", "write", _try("open('{host_tmp_file}', 'w').write('x')", None)),
    Case("write through a symlink planted in the scratch dir", "write", _try(
        "import os\nos.symlink('{out_dir}/metrics.jsonl', 'link')\nopen('link', 'a').write('tampered')\n"
        "print(open('link').read())", None)),
    Case("a hard link to a host file", "write", _try(
        "import os\nos.link('{out_dir}/metrics.jsonl', 'hard')\nopen('hard', 'a').write('tampered')", None)),
    # processes: the decoy stands for the worker (same uid)
    Case("kill the worker", "processes", _try("import os, signal\nos.kill({decoy}, signal.SIGKILL)")),
    Case("signal the worker's process group", "processes", _try("import os, signal\nos.killpg({decoy}, signal.SIGKILL)")),
    Case("ptrace the worker", "processes", _rc("libc.ptrace(16, {decoy}, 0, 0)")),  # PTRACE_ATTACH
    Case("process_vm_readv of the worker", "processes", LIBC + (
        "class V(ctypes.Structure):\n    _fields_ = [('b', ctypes.c_void_p), ('n', ctypes.c_size_t)]\n"
        "buf = ctypes.create_string_buffer(64)\nl, r = V(ctypes.addressof(buf), 64), V(0x400000, 64)\n"
        "n = libc.process_vm_readv({decoy}, ctypes.byref(l), 1, ctypes.byref(r), 1, 0)\n"
        "print('ESCAPED' if n >= 0 or ctypes.get_errno() == 14 else f'failed: errno {{ctypes.get_errno()}}')\n")),
    Case("fork bomb", "processes", "import os\nmade = 0\nfor _ in range(200):\n    try:\n        if os.fork() == 0:\n"
         "            os._exit(0)\n        made += 1\n    except OSError:\n        pass\n"
         "print('ESCAPED: forked' if made else 'failed: no fork')\n"),
    Case("thread bomb", "processes", "import threading, time\nn = 0\ntry:\n    for _ in range(5000):\n"
         "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n        n += 1\nexcept BaseException:\n"
         "    pass\nprint('ESCAPED: threads', n) if n >= 1000 else print('failed at', n)\n"),
    Case("execve /bin/sh", "processes", _try("import os\nos.execv('/bin/sh', ['sh', '-c', 'echo ESCAPED: sh ran'])")),
    # network
    Case("TCP to a listening socket on 127.0.0.1", "network", _try(
        "import socket\ns = socket.create_connection(('127.0.0.1', {tcp_port}), timeout=1)\nprint('ESCAPED: connected')")),
    Case("TCP to Ray's GCS port 6379", "network", _try(
        "import socket\nsocket.create_connection(('127.0.0.1', 6379), timeout=1)")),
    Case("UDP to a listening socket", "network", _try(
        "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.sendto(b'x', ('127.0.0.1', {udp_port}))")),
    Case("AF_UNIX to a socket the worker listens on", "network", _try(
        "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('{unix_path}')\nprint('ESCAPED: connected')")),
    Case("abstract AF_UNIX socket", "network", _try(
        "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('\\0{abstract}')\nprint('ESCAPED: connected')")),
    Case("raw socket", "network", _try("import socket\nsocket.socket(socket.AF_PACKET, socket.SOCK_RAW)")),
    # resources
    Case("10 GB allocation", "resources", _try("x = bytearray(10 * 2 ** 30)")),
    Case("fill the disk (300 MB in files)", "resources", _try(
        "for i in range(300):\n    open(f'fill{{i}}', 'wb').write(b'x' * 2 ** 20)", "wrote 300 MB"), timeout_s=10),
    Case("1 GB of output", "resources", "import sys\nfor _ in range(2 ** 14):\n    sys.stdout.write('x' * 65536)\n"
         "print('ESCAPED: wrote 1 GB')\n", timeout_s=10),
    Case("sleep forever", "resources", "import time\ntime.sleep(10 ** 6)\nprint('ESCAPED: woke')\n", timeout_s=1),
    Case("/dev/shm flood (300 MB)", "resources", _try(
        "for i in range(300):\n    open(f'/dev/shm/{planted}-{{i}}', 'wb').write(b'x' * 2 ** 20)", "wrote 300 MB"),
         timeout_s=10),
    # escalation
    Case("run a setuid binary", "escalation", _try("import os\nos.execv('/usr/bin/su', ['su', '-c', 'echo ESCAPED'])")),
    Case("unshare a user namespace", "escalation", _rc("libc.unshare(0x10000000)")),  # CLONE_NEWUSER
    Case("mount a tmpfs", "escalation", _rc("libc.mount(b'none', b'{mount_dir}', b'tmpfs', 0, None)")),
    Case("chroot", "escalation", _rc("libc.chroot(b'/tmp')")),
    Case("setns into the worker's mount namespace", "escalation", LIBC + (
        "try:\n    fd = os.open('/proc/{decoy}/ns/mnt', os.O_RDONLY)\nexcept OSError as e:\n    fd = -1\n"
        "r = libc.setns(fd, 0) if fd >= 0 else -1\nprint('ESCAPED' if r == 0 else 'failed')\n")),
    Case("bpf()", "escalation", _rc("libc.syscall(321 if os.uname().machine == 'x86_64' else 280, 0, "  # MAP_CREATE
                                    "ctypes.create_string_buffer(__import__('struct').pack('4I', 2, 4, 4, 1) "
                                    "+ bytes(112), 128), 128)")),  # an array map of one 4-byte value
    Case("load a shared library from the scratch dir", "escalation", (
        "import base64, ctypes\nopen('lib.so', 'wb').write(base64.b64decode('{so_b64}'))\n"
        "try:\n    ctypes.CDLL('./lib.so')\n    print('loaded')\nexcept OSError as e:\n    print('failed:', e)\n")),
]


@dataclass
class Targets:
    """What the cases aim at, planted under a fresh folder (and a few host paths), removed by ``close``."""
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="escape-targets-")))

    def __post_init__(self):
        r = self.root
        self.out_dir, self.home, self.data_file = r / "outputs", r / "home", r / "data" / "train.jsonl"
        for d in (self.out_dir / "checkpoint", self.home / ".ray", self.data_file.parent):
            d.mkdir(parents=True)
        (self.out_dir / "metrics.jsonl").write_text(f'{{"step": 1, "note": "{CANARY}"}}\n')
        (self.out_dir / "checkpoint" / "model.pt").write_bytes(b"\x80\x02" + CANARY.encode() * 4)
        self.data_file.write_text(f'{{"prompt": "2+2", "ground_truth": "{CANARY}"}}\n')
        (self.home / ".ray" / "auth_token").write_text(CANARY)
        for p in (r, self.out_dir, self.home, self.data_file.parent):  # readable by anyone: only the boundary stops it
            os.chmod(p, 0o755)
        self.planted = f"escape-{uuid.uuid4().hex[:8]}"
        self.host_tmp_file = Path(tempfile.gettempdir()) / self.planted
        self.mount_dir = r / "mnt"
        self.mount_dir.mkdir()
        self.decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"],
                                      env={"PATH": "/usr/bin:/bin", "WORKER_SECRET": CANARY}, start_new_session=True)
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.unix_path = str(r / "worker.sock")
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(self.unix_path)
        self.unix.listen()
        self.abstract = f"hybridrl-escape-{uuid.uuid4().hex[:8]}"
        self.abstract_sock = socket.socket(socket.AF_UNIX)
        self.abstract_sock.bind("\0" + self.abstract)
        self.abstract_sock.listen()
        self.so_b64 = _shared_library(r, self.host_tmp_file.with_suffix(".so-ran"))
        self.watched = [self.out_dir / "metrics.jsonl", self.out_dir / "planted.txt", self.data_file,
                        PROJECT / self.planted, self.host_tmp_file, self.host_tmp_file.with_suffix(".so-ran"),
                        self.mount_dir]
        self.before = self.snapshot()

    def fields(self) -> dict:
        return {"out_dir": self.out_dir, "home": self.home, "data_file": self.data_file, "project": PROJECT,
                "planted": self.planted, "host_tmp_file": self.host_tmp_file, "decoy": self.decoy.pid,
                "tcp_port": self.tcp.getsockname()[1], "udp_port": self.udp.getsockname()[1],
                "unix_path": self.unix_path, "abstract": self.abstract, "mount_dir": self.mount_dir,
                "so_b64": self.so_b64}

    def snapshot(self) -> dict:
        def state(p: Path):
            if p == self.mount_dir:
                return os.path.ismount(p)
            return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else p.exists()
        shm = sorted(str(p) for p in Path("/dev/shm").glob(f"{self.planted}-*")) if Path("/dev/shm").is_dir() else []
        return {str(p): state(p) for p in self.watched} | {"/dev/shm": shm}

    def judge(self, text: str) -> tuple[bool, str]:
        """(escaped, why) for a case's tool output, against the host's state now."""
        now = self.snapshot()
        changed = [k for k in now if now[k] != self.before[k]]
        why = (["canary in output"] if CANARY in text else []) + (["ESCAPED in output"] if "ESCAPED" in text else []) \
            + [f"changed {k}" for k in changed] + (["the worker died"] if self.decoy.poll() is not None else [])
        return bool(why), "; ".join(why)

    def reset(self) -> None:
        """Undo what an escaped case did (the process-isolation table runs them for real)."""
        if os.path.ismount(self.mount_dir):
            subprocess.run(["umount", "-l", str(self.mount_dir)], check=False)
        for p in [PROJECT / self.planted, self.host_tmp_file, self.host_tmp_file.with_suffix(".so-ran"),
                  self.out_dir / "planted.txt", *Path("/dev/shm").glob(f"{self.planted}-*")]:
            p.unlink(missing_ok=True)
        (self.out_dir / "metrics.jsonl").write_text(f'{{"step": 1, "note": "{CANARY}"}}\n')
        self.data_file.write_text(f'{{"prompt": "2+2", "ground_truth": "{CANARY}"}}\n')
        if self.decoy.poll() is None:
            os.kill(self.decoy.pid, signal.SIGCONT)  # a ptrace attach stops it
        else:
            self.decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"],
                                          env={"PATH": "/usr/bin:/bin", "WORKER_SECRET": CANARY},
                                          start_new_session=True)
        self.before = self.snapshot()

    def close(self) -> None:
        self.reset()
        if self.decoy.poll() is None:
            os.killpg(self.decoy.pid, signal.SIGKILL)
            self.decoy.wait()
        for s in (self.tcp, self.udp, self.unix, self.abstract_sock):
            s.close()
        shutil.rmtree(self.root, ignore_errors=True)


def _shared_library(where: Path, marker: Path) -> str:
    """A shared library (base64) whose constructor writes ``marker`` on the host and prints the canary files it can
    read: loading native code from the scratch dir must leave it as contained as Python. Needs a C compiler."""
    import base64

    src = where / "lib.c"
    src.write_text(f'#include <stdio.h>\n__attribute__((constructor)) static void run(void) {{\n'
                   f'  FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("x", f); fclose(f); }}\n'
                   f'  char b[200] = {{0}}; FILE *g = fopen("{where}/outputs/metrics.jsonl", "r");\n'
                   f'  if (g) {{ fread(b, 1, 199, g); fclose(g); puts(b); }}\n  fflush(stdout);\n}}\n')
    out = where / "lib.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True, capture_output=True)
    return base64.b64encode(out.read_bytes()).decode()


def need_namespaces(compiler: bool = False) -> None:
    """Skip a test where the namespaced sandbox (or, with ``compiler``, a C compiler) is missing -- except in CI
    (``CI=true``), where that fails it."""
    import pytest

    from core.tools.isolation import probe

    why = probe() or (compiler and shutil.which("cc") is None and "no C compiler (cc) for the library case")
    if why:
        (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)(f"no namespaced sandbox here: {why}")


def run_case(case: Case, targets: Targets, isolation: str):
    """The tool's result and the judge's (escaped, why) for one case."""
    from core.tools.sandbox import SandboxLimits, run_python

    r = run_python(case.code.format(**targets.fields()), SandboxLimits(timeout_s=case.timeout_s), isolation=isolation)
    escaped, why = targets.judge(r.text)
    return r, escaped, why
