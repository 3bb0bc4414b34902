"""The seccomp filter of a tool process: the second layer inside the sandbox's namespaces (``core.tools.isolation``),
and the only kernel-enforced one with ``tools.isolation: process``.

Why seccomp besides the namespaces: the kernel never enforces RLIMIT_NPROC on uid 0, a fork bomb inside a PID
namespace still fills the machine's PID table, and every syscall below is a way out of (or into) a namespace or
another process. A filter needs no privileges (``PR_SET_NO_NEW_PRIVS`` first), survives ``execve`` and binds every
thread the tool starts.

What it denies (errno, not a kill: the tool sees an ``OSError`` it can report):
  * fork, vfork, and ``clone`` without ``CLONE_THREAD`` -> EPERM: no child processes (threads stay allowed:
    numpy and BLAS start them);
  * clone3 -> ENOSYS: its flags sit in a struct a filter cannot read, and glibc falls back to ``clone`` on ENOSYS;
  * ``socket`` for any family but AF_UNIX -> EACCES: no IP, packet, raw or netlink sockets;
  * ``DENIED`` -> EPERM: tracing and reading other processes (ptrace, process_vm_*), namespaces and mounts
    (unshare, setns, mount, pivot_root, chroot, the new mount API), kernel keys, BPF, perf, io_uring, userfaultfd,
    modules, kexec, swap, reboot, quotas, port I/O, file handles;
  * ``execve`` and ``execveat`` -> EPERM when the filter is installed with ``exec=False`` (the launcher runs the tool
    in its own interpreter, so no program -- a shell, a setuid binary -- can be started at all);
  * any syscall of another ABI (ia32, and x32's numbers on x86_64) -> EPERM.
x86_64 and aarch64 only; ``available()`` says whether this host has one of them and seccomp.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

# seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
_NR, _ARCH, _ARG0 = 0, 4, 16
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_CLONE_THREAD, _AF_UNIX, _X32_BIT = 0x00010000, 1, 0x40000000
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2

DENIED = ("ptrace", "process_vm_readv", "process_vm_writev", "unshare", "setns", "mount", "umount2", "pivot_root",
          "chroot", "fsopen", "fsmount", "move_mount", "open_tree", "mount_setattr", "keyctl", "add_key",
          "request_key", "bpf", "perf_event_open", "io_uring_setup", "io_uring_enter", "io_uring_register",
          "userfaultfd", "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "swapon",
          "swapoff", "reboot", "quotactl", "iopl", "ioperm", "open_by_handle_at")

# per machine: audit arch, and the syscall numbers (absent: the ABI has no such call); checked against the kernel
# headers in tests/tools/test_seccomp.py
_TABLES = {
    "x86_64": {"arch": 0xC000003E, "fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "socket": 41, "execve": 59,
               "execveat": 322, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "unshare": 272,
               "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "fsopen": 430,
               "fsmount": 432, "move_mount": 429, "open_tree": 428, "mount_setattr": 442, "keyctl": 250,
               "add_key": 248, "request_key": 249, "bpf": 321, "perf_event_open": 298, "io_uring_setup": 425,
               "io_uring_enter": 426, "io_uring_register": 427, "userfaultfd": 323, "init_module": 175,
               "finit_module": 313, "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320, "swapon": 167,
               "swapoff": 168, "reboot": 169, "quotactl": 179, "iopl": 172, "ioperm": 173,
               "open_by_handle_at": 304},
    "aarch64": {"arch": 0xC00000B7, "clone": 220, "clone3": 435, "socket": 198, "execve": 221, "execveat": 281,
                "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "unshare": 97, "setns": 268,
                "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "fsopen": 430, "fsmount": 432,
                "move_mount": 429, "open_tree": 428, "mount_setattr": 442, "keyctl": 219, "add_key": 217,
                "request_key": 218, "bpf": 280, "perf_event_open": 241, "io_uring_setup": 425,
                "io_uring_enter": 426, "io_uring_register": 427, "userfaultfd": 282, "init_module": 105,
                "finit_module": 273, "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294,
                "swapon": 224, "swapoff": 225, "reboot": 142, "quotactl": 60, "open_by_handle_at": 265},
}


def available() -> bool:
    """The host's ABI is in the table and the kernel takes seccomp filters (Linux)."""
    return platform.system() == "Linux" and platform.machine() in _TABLES


def program(exec_allowed: bool = True) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions (jumps counted from the next instruction), assembled from
    labels: each check jumps to one of the four returns at the end."""
    t = _TABLES[platform.machine()]
    deny = [t[n] for n in DENIED + (("fork", "vfork") + (() if exec_allowed else ("execve", "execveat")))
            if n in t]
    code: list[tuple] = [
        (_LD_W_ABS, 0, 0, _ARCH), (_JEQ_K, None, "deny", t["arch"]),   # another ABI (ia32): deny everything
        (_LD_W_ABS, 0, 0, _NR), (_JGE_K, "deny", None, _X32_BIT),        # x32's numbers under the same arch
        *((_JEQ_K, "deny", None, nr) for nr in deny),
        (_JEQ_K, "enosys", None, t["clone3"]), (_JEQ_K, "clone", None, t["clone"]),
        (_JEQ_K, "socket", None, t["socket"]), (_RET_K, 0, 0, _ALLOW),  # everything else
        ("clone:", _LD_W_ABS, 0, 0, _ARG0), (_JSET_K, "allow", "deny", _CLONE_THREAD),
        ("socket:", _LD_W_ABS, 0, 0, _ARG0), (_JEQ_K, "allow", "eacces", _AF_UNIX),
        ("deny:", _RET_K, 0, 0, _ERRNO | errno.EPERM), ("enosys:", _RET_K, 0, 0, _ERRNO | errno.ENOSYS),
        ("eacces:", _RET_K, 0, 0, _ERRNO | errno.EACCES), ("allow:", _RET_K, 0, 0, _ALLOW),
    ]
    labels = {c[0][:-1]: i for i, c in enumerate(code) if isinstance(c[0], str)}
    out = []
    for i, c in enumerate(code):
        op, jt, jf, k = c[1:] if isinstance(c[0], str) else c
        rel = [labels[j] - i - 1 if isinstance(j, str) else 0 for j in (jt, jf)]
        assert all(0 <= r < 256 for r in rel), "seccomp jump out of range"
        out.append((op, rel[0], rel[1], k))
    return out


def install(exec_allowed: bool = True) -> None:
    """Install the filter on the calling thread (and whatever it execs): ``PR_SET_NO_NEW_PRIVS``, then the filter.
    Raises OSError when the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    insns = program(exec_allowed)
    raw = b"".join(struct.pack("HBBI", *i) for i in insns)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(insns), ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
