"""The command line a verl run script ends in, found by running it with stand-ins first on ``PATH``.

verl's scripts are bash with environment defaults (``${LR:-1e-6}``), derived values (``$((N * 8))``) and a
launcher in front (``python3 -m verl.trainer.main_ppo``, ``uv run python3 -m ...``, ``ray job submit -- python3
...``). Rather than parse bash, the script runs with a folder of stand-ins first on ``PATH`` -- ``python``,
``python3``, ``uv``, ``ray``, ``torchrun``, ``nvidia-smi``, ... -- each of which writes its arguments to a log and
exits 0 (``_STAND_IN`` says what probes and queries answer), so bash expands everything and the last call to
``verl.trainer.main_ppo`` holds the final overrides. ``BASH_ENV`` stubs ``ulimit`` and makes the stand-ins shell
functions too, so a script that puts a real python first on ``PATH`` still reaches them.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

# programs a verl script calls; each stand-in logs its argv and exits 0
STAND_INS = ("python", "python3", "uv", "ray", "torchrun", "accelerate", "deepspeed", "nvidia-smi", "huggingface-cli",
             "hf", "wandb", "pip", "pip3", "git", "wget", "curl", "modelscope", "sleep", "conda")
TRAIN_ENTRY = ("verl.trainer.main_ppo", "main_ppo.py", "recipe.")  # preferred over a later generation call
ENTRY = TRAIN_ENTRY + ("verl.trainer.main_generation",)

# logs its call. ``python -c <code>``: a query that prints (a GPU count) prints 8; a probe that only imports
# (torch_npu, ...) fails, as on a machine without the package. ``nvidia-smi`` lists HYBRIDRL_STANDIN_GPUS (8) GPUs.
_STAND_IN = """#!{python}
import json, os, sys
with open(os.environ["HYBRIDRL_STANDIN_LOG"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\\n")
if os.path.basename(sys.argv[0]) == "nvidia-smi":
    print("\\n".join(["NVIDIA H100 80GB HBM3"] * int(os.environ.get("HYBRIDRL_STANDIN_GPUS", "8"))))
if sys.argv[1:2] == ["-c"]:
    if "print(" in sys.argv[2]:
        print(os.environ.get("HYBRIDRL_STANDIN_GPUS", "8"))
    else:
        sys.exit(1)
"""


def _bash_env(bin_dir: Path) -> str:
    """Sourced by the script's bash (BASH_ENV): ``ulimit`` does nothing (a small machine's limits would stop it), and
    each stand-in is also a function -- functions win over PATH, so a script that puts a real python or conda first
    on PATH still calls the stand-ins."""
    fns = "".join(f'{n}() {{ "{bin_dir / n}" "$@"; }}\nexport -f {n}\n' for n in STAND_INS)
    return "ulimit() { return 0; }\n" + fns


class ScriptError(ValueError):
    """The script ends in no verl training command (or does not run under the stand-ins)."""


@dataclass
class ScriptRun:
    calls: list[list[str]]  # every stand-in call, in order: [program, *args]
    returncode: int
    stderr: str  # its stderr, else its stdout (what it said last)


def recorded_calls(script: str | Path, env: dict[str, str] | None = None, timeout_s: float = 60.0) -> ScriptRun:
    """Run ``script`` under the stand-ins (from a scratch folder: what it writes lands there)."""
    script = Path(script).resolve()
    if not script.is_file():
        raise ScriptError(f"{script}: no such file")
    with tempfile.TemporaryDirectory(prefix="hybridrl-convert-") as tmp:
        bin_dir, log = Path(tmp) / "bin", Path(tmp) / "calls.jsonl"
        bin_dir.mkdir()
        for name in STAND_INS:
            path = bin_dir / name
            path.write_text(_STAND_IN.format(python=sys.executable))
            path.chmod(0o755)
        log.touch()
        (Path(tmp) / "bash_env").write_text(_bash_env(bin_dir))
        run_env = {**os.environ, **(env or {}), "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
                   "HYBRIDRL_STANDIN_LOG": str(log), "HOME": os.environ.get("HOME", tmp),
                   "BASH_ENV": str(Path(tmp) / "bash_env")}
        proc = subprocess.Popen(["bash", str(script)], cwd=tmp, env=run_env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the script and everything it started
            proc.communicate()
            raise ScriptError(f"{script}: did not finish in {timeout_s:.0f}s under the stand-ins") from None
        calls = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return ScriptRun(calls, proc.returncode, err.strip() or out.strip())


def verl_overrides(run: ScriptRun, script: str | Path = "the script") -> tuple[list[str], str]:
    """The overrides of the last verl training call (else of the last generation call) and its launcher (e.g.
    ``python3 -m verl.trainer.main_ppo``): its ``key=value`` arguments, and ``--config-name`` / ``--config-path``
    as ``--config-name=X``."""
    for entries in (TRAIN_ENTRY, ENTRY):
        for call in reversed(run.calls):
            at = next((i for i, a in enumerate(call) if any(a.startswith(e) or a.endswith(e) for e in entries)), None)
            if at is None:
                continue
            args = call[at + 1:]
            flags = [f"{a}={b}" for a, b in zip(args, args[1:]) if a in ("--config-name", "--config-path")]
            flags += [a for a in args if a.startswith(("--config-name=", "--config-path="))]
            return [a for a in args if "=" in a and not a.startswith("-")] + flags, shlex.join(call[:at + 1])
    said = (run.stderr.strip() or "(no output)").splitlines()[-1][-300:]
    if not run.calls:
        raise ScriptError(f"{script}: exits {run.returncode} before it calls python: {said}")
    programs = sorted({c[0] for c in run.calls})
    raise ScriptError(f"{script}: calls no verl trainer (verl.trainer.main_ppo); it called {', '.join(programs)} and "
                      f"exited {run.returncode}: {said}")
