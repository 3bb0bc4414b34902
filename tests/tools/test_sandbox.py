"""The tool sandbox (core/tools/sandbox.py) with real processes: each misbehaving tool the issue names -- sleeps
forever, allocates 10 GB, forks a bomb, prints 1 GB -- is contained and reported, and the caller goes on."""

import os
import time

import pytest

from core.tools import seccomp
from core.tools.sandbox import SandboxLimits, run_python

needs_seccomp = pytest.mark.skipif(not seccomp.available(), reason="seccomp filter: x86_64 / aarch64 Linux only")
FAST = SandboxLimits(timeout_s=2.0)


def test_a_plain_call_returns_its_output():
    r = run_python("print(6 * 7)")
    assert (r.text, r.status, r.exit_code, r.ok) == ("42\n", "ok", 0, True)


def test_an_exception_is_the_model_s_to_read():
    r = run_python("x = 1\nprint('before')\n1 / 0")
    assert r.status == "error" and r.exit_code == 1
    assert r.text.startswith("before\n") and "ZeroDivisionError: division by zero" in r.text
    assert r.text.endswith("[tool exited with code 1]")


def test_sleeping_forever_times_out_and_is_killed():
    t = time.monotonic()
    r = run_python("import time\nprint('start', flush=True)\ntime.sleep(10 ** 6)", FAST)
    assert r.status == "timeout" and r.text == "start\n[tool timed out after 2 s]"
    assert time.monotonic() - t < 4.0 and r.exit_code == -9


def test_closing_the_output_and_sleeping_is_a_timeout_too():
    r = run_python("import os, time\nos.close(1)\nos.close(2)\ntime.sleep(10 ** 6)", FAST)
    assert r.status == "timeout" and r.exit_code == -9


def test_allocating_10_gb_fails_inside_the_tool():
    r = run_python("x = bytearray(10 * 2 ** 30)\nprint('allocated')")
    assert r.status == "error" and "MemoryError" in r.text and "allocated" not in r.text


def test_printing_1_gb_is_cut_at_the_output_limit_and_stopped():
    t = time.monotonic()
    r = run_python("import sys\nfor _ in range(2 ** 14):\n    sys.stdout.write('x' * 65536)\nprint('done')",
                   SandboxLimits(timeout_s=30.0, max_output_bytes=4096))
    assert r.status == "output_limit" and r.exit_code == -9
    assert r.text == "x" * 4096 + "\n[tool output truncated at 4096 bytes; the tool was stopped]"
    assert time.monotonic() - t < 10.0  # stopped at the limit, not after writing 1 GB


@needs_seccomp
def test_a_fork_bomb_forks_nothing():
    """Forks fail with EPERM (the filter; RLIMIT_NPROC would not bind a root worker): the bomb loops on its
    errors until the wall time, having made no process."""
    code = ("import os\nmade = 0\nfor _ in range(1000):\n    try:\n        pid = os.fork()\n    except OSError as e:\n"
            "        err = e.errno\n        continue\n    if pid == 0:\n        os._exit(0)\n    made += 1\n"
            "print('made', made, 'errno', err, flush=True)\nwhile True:\n    try:\n        os.fork()\n"
            "    except OSError:\n        pass\n")
    r = run_python(code, FAST)
    assert r.text.startswith("made 0 errno 1\n") and r.status == "timeout"
    r = run_python("import subprocess\nsubprocess.run(['true'])")
    assert r.status == "error" and "PermissionError" in r.text


@needs_seccomp
def test_threads_work_and_sockets_other_than_unix_do_not():
    r = run_python("import threading\nout = []\nt = threading.Thread(target=lambda: out.append(1))\nt.start()\n"
                   "t.join()\nprint(out)")
    assert r.text == "[1]\n" and r.ok
    r = run_python("import socket\nsocket.socket(socket.AF_UNIX).close()\nprint('unix ok', flush=True)\n"
                   "socket.socket(socket.AF_INET, socket.SOCK_STREAM)")
    assert r.text.startswith("unix ok\n") and "PermissionError: [Errno 13]" in r.text


@pytest.mark.parametrize("isolation", ["namespaces", "process"])
def test_a_scratch_directory_that_goes_away_and_an_environment_without_secrets(monkeypatch, isolation):
    import glob
    import tempfile

    monkeypatch.setenv("HF_TOKEN", "secret")
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "hybridrl-tool-*")))
    r = run_python("import os\nopen('notes.txt', 'w').write('hi')\nprint(open('notes.txt').read(), os.getcwd(),"
                   " os.environ.get('HF_TOKEN'))", isolation=isolation)
    said, cwd, token = r.text.split()
    assert (said, token) == ("hi", "None")
    if isolation == "namespaces":  # a tmpfs of its own
        assert cwd == "/scratch" and r.isolation.startswith("namespaces+")
    else:
        assert os.path.basename(cwd).startswith("hybridrl-tool-") and not os.path.exists(cwd)
        assert r.isolation == ("seccomp+rlimits" if seccomp.available() else "rlimits")
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "hybridrl-tool-*"))) == before
