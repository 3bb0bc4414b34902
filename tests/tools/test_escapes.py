"""The escape suite: every case of tests/tools/escapes.py, run in the default sandbox (namespaces), is contained --
no canary in the tool's output, every watched host path unchanged, the decoy worker alive -- and the tool's process
is seen from outside as uid 65534 with no capabilities, in namespaces of its own. Where namespaces cannot be made
the sandbox refuses with a message naming the setting (shown in a user namespace that allows no more of them).

A machine without namespaces skips these, except in CI (``CI=true``), where that is a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from core.tools import isolation
from core.tools.sandbox import SandboxLimits, run_python
from tests.tools.escapes import CASES, PROJECT, Targets, need_namespaces, run_case


@pytest.fixture(scope="module")
def targets():
    need_namespaces(compiler=True)
    t = Targets()
    yield t
    t.close()


def test_at_least_30_cases_in_every_group():
    groups = {c.group for c in CASES}
    assert len(CASES) >= 30 and groups == {"read", "write", "processes", "network", "resources", "escalation"}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_contained(case, targets):
    r, escaped, why = run_case(case, targets, "namespaces")
    targets.reset()
    assert not escaped, f"{case.name}: {why}\n{r.text}"
    assert r.isolation.startswith("namespaces+seccomp+rlimits")


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def test_the_tool_is_nobody_without_capabilities_in_namespaces_of_its_own():
    """Read from outside: /proc/<tool pid>/status and /proc/<tool pid>/ns while the tool sleeps."""
    need_namespaces()
    result = {}
    t = threading.Thread(target=lambda: result.update(r=run_python("import time\ntime.sleep(3)",
                                                                   SandboxLimits(timeout_s=10))))
    t.start()
    tool = None
    for _ in range(200):
        for pid in _descendants(os.getpid()):
            try:
                argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
                if argv[0] == isolation.interpreter().encode() and argv[2].endswith(b"sandbox_launch.py"):  # not bwrap's
                    tool = pid
            except OSError:
                pass
        if tool:
            break
        time.sleep(0.01)
    assert tool, "the tool process was not found"
    for _ in range(200):  # until the launcher has set the filter and runs the tool's code
        status = dict(line.split(":", 1) for line in open(f"/proc/{tool}/status").read().splitlines() if ":" in line)
        if status["Seccomp"].strip() == "2":
            break
        time.sleep(0.01)
    ours = {ns: os.readlink(f"/proc/self/ns/{ns}") for ns in ("user", "mnt", "pid", "net", "ipc", "uts")}
    theirs = {ns: os.readlink(f"/proc/{tool}/ns/{ns}") for ns in ours}
    uid_map = open(f"/proc/{tool}/uid_map").read().split()
    t.join()
    expect_uid = str(isolation.TOOL_UID) if isolation.real_root() else str(os.getuid())
    assert status["Uid"].split() == [expect_uid] * 4 and status["Gid"].split()[0] == expect_uid
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0 and status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2"
    assert uid_map[1:] == [expect_uid, "1"], uid_map  # one uid, the tool's own, outside
    assert all(ours[ns] != theirs[ns] for ns in ours), (ours, theirs)
    assert result["r"].ok


def test_no_namespaces_is_a_refusal_naming_the_setting_never_a_downgrade():
    """In a user namespace whose max_user_namespaces is 0 (what a locked-down container gives): the tool refuses
    and says what allows it; with tools.isolation: process it runs."""
    need_namespaces()
    code = ("from core.tools.sandbox import run_python\nfrom core.tools.isolation import SandboxUnavailable\n"
            "from core.config import RunConfig, validate\nfrom core.checks import check_tools_isolation\n"
            "print(run_python('print(1)', isolation='process').text.strip())\n"
            "try:\n    run_python('print(1)')\nexcept SandboxUnavailable as e:\n    print('refused:', e)\n"
            "for iso in ('namespaces', 'process'):\n"
            "    cfg = validate(RunConfig, {'rollout': {'agent': {'enable': True}}, 'tools': {'isolation': iso}})\n"
            "    try:\n        check_tools_isolation(cfg, [])\n        print('run starts')\n"
            "    except Exception as e:\n        print('run refused:', type(e).__name__, str(e)[:60])\n")
    r = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c",
                        f"echo 0 > /proc/sys/user/max_user_namespaces && exec {sys.executable} -c \"$0\"", code],
                       capture_output=True, text=True, cwd=PROJECT, timeout=60)
    assert r.returncode == 0, r.stderr
    ran, refused, run_refused, run_starts = r.stdout.strip().split("\n")
    assert ran == "1" and run_starts == "run starts"
    assert run_refused.startswith("run refused: ConfigError tools.isolation: namespaces, but they cannot be")
    assert refused.startswith("refused: tools.isolation: namespaces, but they cannot be made on this host (")
    assert "max_user_namespaces" in refused and "tools.isolation: process" in refused


def test_a_python_environment_under_tmp_runs_tools(tmp_path):
    """The sandbox mounts a fresh /tmp: an environment that lives under /tmp (a CI runner's checkout), reached
    through a link as a worktree's ``.venv`` often is, is bound after it and still runs the tool."""
    need_namespaces()
    assert str(tmp_path).startswith("/tmp/")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    (tmp_path / "linked").symlink_to(tmp_path / "venv")
    code = "from core.tools.sandbox import run_python\nprint(run_python('print(6 * 7)').text.strip())"
    for python in (tmp_path / "venv" / "bin" / "python", tmp_path / "linked" / "bin" / "python"):
        r = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(PROJECT)})
        assert r.stdout.strip() == "42", (python, r.stdout[-500:], r.stderr[-1500:])
