"""The sandbox's launcher (``core.tools.sandbox.run_python``), the tool's interpreter: set the tool's rlimits and
seccomp filter here, single-threaded, then run the tool's ``main.py`` in this same interpreter. Running it here
rather than exec'ing it lets the filter deny ``execve``: the tool can start no program (a shell, a setuid binary).
Doing this in ``preexec_fn`` ran Python between fork and exec in the caller's copy -- a rollout worker with gloo,
gRPC and tool threads -- and deadlocked there.

    python -I sandbox_launch.py '{"memory_bytes": ..., "cpu_s": ..., "file_bytes": ..., "open_files": ...,
                                  "seccomp": true}' /path/to/main.py
Stdlib only, and loaded by path (a copy sits beside ``main.py``): the tool's interpreter imports nothing of this
project. A ``stdin`` file beside ``main.py`` is the tool's standard input. An exception's traceback shows the tool's
frames only.
"""

import json
import os
import resource
import runpy
import sys
import traceback


def main() -> None:
    limits, main_py = json.loads(sys.argv[1]), sys.argv[2]
    for which, value in ((resource.RLIMIT_AS, limits["memory_bytes"]), (resource.RLIMIT_CPU, limits["cpu_s"]),
                         (resource.RLIMIT_FSIZE, limits["file_bytes"]), (resource.RLIMIT_NOFILE, limits["open_files"]),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(which, (value, value))
    stdin = os.path.join(os.path.dirname(main_py), "stdin")
    if os.path.exists(stdin):
        fd = os.open(stdin, os.O_RDONLY)
        os.dup2(fd, 0)
        os.close(fd)
    if limits["seccomp"]:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import seccomp

        seccomp.install(exec_allowed=False)
        del sys.path[0], sys.modules["seccomp"]
    sys.argv = [main_py]
    try:
        runpy.run_path(main_py, run_name="__main__")
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 (the tool's error, printed as Python would, from its own frames)
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != main_py:
            tb = tb.tb_next
        sys.stdout.flush()  # what it printed comes before the traceback, as when Python runs a script
        traceback.print_exception(type(e), e, tb)
        sys.exit(1)


if __name__ == "__main__":
    main()
