"""A seccomp filter for tool processes: no new processes, no network sockets -- for root and non-root alike.

Why seccomp and not the usual limits: the sandbox's host process is often root (containers), and the kernel never
enforces RLIMIT_NPROC on uid 0, so a fork bomb would fill the machine's PID table before any wall-time limit
fires; and a network namespace needs privileges a non-root worker lacks. A seccomp filter needs neither
(``PR_SET_NO_NEW_PRIVS`` first), survives ``execve`` and binds every thread the tool starts.

What it denies (errno, not a kill: the tool sees an ``OSError`` it can report):
  * fork, vfork, and ``clone`` without ``CLONE_THREAD`` -> EPERM: no child processes (threads stay allowed:
    numpy and BLAS start them);
  * clone3 -> ENOSYS: its flags sit in a struct a filter cannot read, and glibc falls back to ``clone`` on ENOSYS;
  * ``socket`` for any family but AF_UNIX -> EACCES: no IP, packet or netlink sockets.
Any other syscall, and any call from another ABI than the host's, is allowed / refused as the table below says.
x86_64 and aarch64 only; ``available()`` says whether this machine has one of them and seccomp.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

# seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
_NR, _ARCH, _ARG0 = 0, 4, 16
_LD_W_ABS, _JEQ_K, _JSET_K, _RET_K = 0x20, 0x15, 0x45, 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_CLONE_THREAD, _AF_UNIX = 0x00010000, 1
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2

# per machine: audit arch, and the syscall numbers (None: the ABI has no such call)
_TABLES = {
    "x86_64": {"arch": 0xC000003E, "fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "socket": 41},
    "aarch64": {"arch": 0xC00000B7, "fork": None, "vfork": None, "clone": 220, "clone3": 435, "socket": 198},
}


def available() -> bool:
    """This machine's ABI is in the table and the kernel takes seccomp filters (Linux)."""
    return platform.system() == "Linux" and platform.machine() in _TABLES


def program() -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions. Jumps are counted from the next instruction."""
    t = _TABLES[platform.machine()]
    deny, enosys, eacces, allow = (_RET_K, 0, 0, _ERRNO | errno.EPERM), (_RET_K, 0, 0, _ERRNO | errno.ENOSYS), \
        (_RET_K, 0, 0, _ERRNO | errno.EACCES), (_RET_K, 0, 0, _ALLOW)
    # layout: [0] ld arch, [1] arch check, [2] ld nr, [3..7] dispatch, [8] allow, [9..10] clone, [11..12] socket,
    # [13] deny, [14] enosys, [15] eacces, [16] allow
    nothing = 0xFFFFFFFF  # a syscall number no ABI has: the jump never fires
    return [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ_K, 0, 11, t["arch"]),                     # another ABI (x32, ia32): deny everything it asks
        (_LD_W_ABS, 0, 0, _NR),
        (_JEQ_K, 9, 0, t["fork"] if t["fork"] is not None else nothing),      # -> [13] deny
        (_JEQ_K, 8, 0, t["vfork"] if t["vfork"] is not None else nothing),    # -> [13] deny
        (_JEQ_K, 8, 0, t["clone3"]),                                          # -> [14] enosys
        (_JEQ_K, 2, 0, t["clone"]),                                           # -> [9] clone check
        (_JEQ_K, 3, 0, t["socket"]),                                          # -> [11] socket check
        allow,                                                                # [8]
        (_LD_W_ABS, 0, 0, _ARG0),                                             # [9] clone flags (low 32 bits)
        (_JSET_K, 5, 2, _CLONE_THREAD),                                       # thread -> [16]; else -> [13]
        (_LD_W_ABS, 0, 0, _ARG0),                                             # [11] socket family
        (_JEQ_K, 3, 2, _AF_UNIX),                                             # unix -> [16]; else -> [15]
        deny,                                                                 # [13]
        enosys,                                                               # [14]
        eacces,                                                               # [15]
        allow,                                                                # [16]
    ]


def install() -> None:
    """Install the filter on the calling thread (and whatever it execs). For ``preexec_fn``: after the fork, before
    the tool's exec. Raises OSError when the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    insns = program()
    raw = b"".join(struct.pack("HBBI", *i) for i in insns)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(insns), ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
