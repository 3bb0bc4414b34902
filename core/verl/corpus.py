"""``python -m core.verl.corpus <verl checkout>``: every ``examples/*_trainer/*.sh`` of verl through
``convert-verl`` and ``hybridrl plan``; one line per script and the counts (a checkout of verl-project/verl; its
scripts are not part of this repository).

A script *plans clean* when it converts with no unsupported key and ``hybridrl plan`` of the result exits 0 (a plan
that fits, or has no GPU to judge by). Unsupported keys are tallied across scripts with their reason.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import sys
import tempfile
from pathlib import Path

from core.verl.script import ScriptError, recorded_calls, verl_overrides
from core.verl.translate import translate


def check(script: Path, tmp: Path) -> tuple[str, list[str], str]:
    """(outcome, unsupported lines, detail): converted | unsupported | no-run | plan-error."""
    from core.config.errors import ConfigError, answer_user_errors
    from core.run import main as run_main

    try:
        overrides, _ = verl_overrides(recorded_calls(script), script)
    except ScriptError as e:
        return "no verl run", [], str(e).splitlines()[0]
    tr = translate(overrides)
    if tr.unsupported:
        return "unsupported", tr.unsupported, ""
    folder = tmp / script.stem
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(tr.yaml() + "\n")
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            rc = answer_user_errors(lambda argv: run_main(argv, config_dir=folder), ["--dry-run"])
    except (ConfigError, SystemExit, Exception) as e:  # noqa: BLE001 -- a corpus run reports, it does not stop
        return "plan error", [], f"{type(e).__name__}: {e}".splitlines()[0][:200]
    last = out.getvalue().strip().splitlines()[-1] if out.getvalue().strip() else ""
    return ("plans clean" if rc == 0 else "plan error"), [], last[:200]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m core.verl.corpus", description=__doc__.split("\n\n")[0])
    p.add_argument("verl", type=Path, help="a checkout of verl-project/verl")
    p.add_argument("--glob", default="examples/*_trainer/*.sh", help="scripts under the checkout")
    a = p.parse_args(argv)
    scripts = sorted(a.verl.glob(a.glob))
    outcomes, reasons = collections.Counter(), collections.Counter()
    with tempfile.TemporaryDirectory(prefix="hybridrl-verl-corpus-") as tmp:
        for script in scripts:
            outcome, unsupported, detail = check(script, Path(tmp))
            outcomes[outcome] += 1
            reasons.update(line.split("=")[0].split(":")[0] + ": " + line.split(": ", 1)[-1] for line in unsupported)
            print(f"{outcome:<12} {script.relative_to(a.verl)}  {detail or '; '.join(unsupported)[:300]}", flush=True)
    print(f"\n{len(scripts)} scripts: " + ", ".join(f"{n} {k}" for k, n in outcomes.most_common()))
    print("unsupported keys (scripts):")
    for reason, n in reasons.most_common(25):
        print(f"  {n:3d}  {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
