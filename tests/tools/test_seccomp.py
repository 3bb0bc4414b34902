"""core.tools.seccomp: the syscall numbers against the kernel's own headers, and each denied call denied for real
in a child that installed the filter."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from core.tools import seccomp

HEADERS = {"x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
           "aarch64": Path("/usr/include/asm-generic/unistd.h")}


@pytest.mark.parametrize("machine", sorted(seccomp._TABLES))
def test_numbers_match_the_kernel_headers(machine):
    header = HEADERS[machine]
    if not header.exists():
        pytest.skip(f"{header} not installed (linux-libc-dev)")
    text = header.read_text()
    for name, nr in seccomp._TABLES[machine].items():
        if name == "arch":
            continue
        m = re.search(rf"#define __NR(?:3264)?_{name}\s+(\d+)", text)
        assert m and int(m.group(1)) == nr, (machine, name, nr)


@pytest.mark.skipif(not seccomp.available(), reason="seccomp filter: x86_64 / aarch64 Linux only")
def test_denied_calls_fail_with_eperm_and_allowed_ones_work():
    code = (f"import sys, ctypes, os, errno\nsys.path.insert(0, {str(Path(seccomp.__file__).parent)!r})\n"
            "import seccomp\nlibc = ctypes.CDLL(None, use_errno=True)\nseccomp.install(exec_allowed=False)\n"
            "t = seccomp._TABLES[os.uname().machine]\nbad = []\n"
            "for name in seccomp.DENIED + ('execve',):\n    if name in t:\n"
            "        r = libc.syscall(t[name], 0, 0, 0, 0, 0)\n"
            "        if r != -1 or ctypes.get_errno() != errno.EPERM:\n            bad.append((name, r, ctypes.get_errno()))\n"
            "print('bad', bad)\nprint('getpid ok', os.getpid() > 0)\n"
            "print('x32', libc.syscall(0x40000000 | 39) == -1 and ctypes.get_errno() == errno.EPERM)\n")
    r = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.split("\n")[:3] == ["bad []", "getpid ok True", "x32 True"], r.stdout + r.stderr
