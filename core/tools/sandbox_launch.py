"""The sandbox's launcher (``core.tools.sandbox.run_python``), exec'd as its own interpreter: set the tool's
rlimits and seccomp filter here, single-threaded, then exec the tool. Doing it in ``preexec_fn`` ran Python between
fork and exec in the caller's copy -- a rollout worker with gloo, gRPC and tool threads -- and deadlocked there
(a forked child freeing an inherited process group waited on a thread that did not exist in it).

    python -I sandbox_launch.py '{"memory_bytes": ..., "cpu_s": ..., "file_bytes": ..., "open_files": ...,
                                  "seccomp": true}' main.py
Stdlib only, and loaded by path: the tool's interpreter imports nothing of this project.
"""

import json
import os
import resource
import sys


def main() -> None:
    limits = json.loads(sys.argv[1])
    for which, value in ((resource.RLIMIT_AS, limits["memory_bytes"]), (resource.RLIMIT_CPU, limits["cpu_s"]),
                         (resource.RLIMIT_FSIZE, limits["file_bytes"]), (resource.RLIMIT_NOFILE, limits["open_files"]),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(which, (value, value))
    if limits["seccomp"]:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import seccomp

        seccomp.install()
    os.execv(sys.executable, [sys.executable, "-I", *sys.argv[2:]])


if __name__ == "__main__":
    main()
