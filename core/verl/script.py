"""The command line a verl run script ends in, found by running it with stand-ins first on ``PATH``.

verl's scripts are bash with environment defaults (``${LR:-1e-6}``), derived values (``$((N * 8))``) and a
launcher in front (``python3 -m verl.trainer.main_ppo``, ``uv run python3 -m ...``, ``ray job submit -- python3
...``). Rather than parse bash, the script runs with a folder of stand-ins first on ``PATH`` -- ``python``,
``python3``, ``uv``, ``ray``, ``torchrun``, ``nvidia-smi``, ... -- each of which writes its arguments to a log and
exits 0 (``python -c <probe>`` exits 1, as where the probed package is missing), so bash expands everything and the
last call to ``verl.trainer.main_ppo`` holds the final overrides. Builtins that would stop a script on a small
machine (``ulimit -n 32768``) are stubbed through ``BASH_ENV``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

# programs a verl script calls; each stand-in logs its argv and exits 0
STAND_INS = ("python", "python3", "uv", "ray", "torchrun", "accelerate", "deepspeed", "nvidia-smi", "huggingface-cli",
             "hf", "wandb", "pip", "pip3", "git", "wget", "curl", "modelscope", "sleep")
ENTRY = ("verl.trainer.main_ppo", "main_ppo.py", "verl.trainer.main_generation", "recipe.")

# logs its call; ``python -c <probe>`` fails, as on a machine without the probed package (torch_npu, ...)
_STAND_IN = """#!{python}
import json, os, sys
with open(os.environ["HYBRIDRL_STANDIN_LOG"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\\n")
sys.exit(1 if sys.argv[1:2] == ["-c"] else 0)
"""
# sourced by the script's bash (BASH_ENV): shell builtins that would stop it on a small machine do nothing
_BASH_ENV = "ulimit() { return 0; }\n"


class ScriptError(ValueError):
    """The script ends in no verl training command (or does not run under the stand-ins)."""


def recorded_calls(script: str | Path, env: dict[str, str] | None = None, timeout_s: float = 60.0) -> list[list[str]]:
    """Every stand-in call the script made, in order: [program, *args]."""
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
        (Path(tmp) / "bash_env").write_text(_BASH_ENV)
        run_env = {**os.environ, **(env or {}), "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
                   "HYBRIDRL_STANDIN_LOG": str(log), "HOME": os.environ.get("HOME", tmp),
                   "BASH_ENV": str(Path(tmp) / "bash_env")}
        try:  # from a scratch folder: a script that cds, mkdirs or writes logs does so there
            r = subprocess.run(["bash", str(script)], cwd=tmp, env=run_env, capture_output=True, text=True,
                               timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise ScriptError(f"{script}: did not finish in {timeout_s:.0f}s under the stand-ins") from None
        calls = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    if not calls and r.returncode != 0:
        said = (r.stderr.strip() or r.stdout.strip() or "(no output)").splitlines()[-1][-300:]
        raise ScriptError(f"{script}: exits {r.returncode} before it calls python: {said}")
    return calls


def verl_overrides(calls: list[list[str]], script: str | Path = "the script") -> tuple[list[str], str]:
    """The overrides of the last verl training call and its launcher (e.g. ``python3 -m verl.trainer.main_ppo``):
    the arguments after the entry point that look like ``key=value`` (``--config-path/--config-name`` kept aside)."""
    for call in reversed(calls):
        at = next((i for i, a in enumerate(call) if any(a.startswith(e) or a.endswith(e) for e in ENTRY)), None)
        if at is None:
            continue
        launcher = shlex.join(call[:at + 1])
        args = call[at + 1:]
        return [a for a in args if "=" in a and not a.startswith("-")] + \
            [f"{a}={b}" for a, b in zip(args, args[1:]) if a in ("--config-name", "--config-path")], launcher
    programs = sorted({c[0] for c in calls})
    raise ScriptError(f"{script}: calls no verl trainer (verl.trainer.main_ppo); it called "
                      f"{', '.join(programs) or 'nothing'}")
