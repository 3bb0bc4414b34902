"""``hybridrl train --verl`` / ``plan --verl`` and ``hybridrl convert-verl``: verl's keys in, our run out.

    hybridrl train --verl data.train_batch_size=8 actor_rollout_ref.rollout.n=4 ... [--dry-run]
    hybridrl convert-verl examples/grpo_trainer/run_qwen3_8b_fsdp.sh [--out runs/qwen3_grpo]

Every verl key given is accounted for before anything starts: translated (``core.verl.keys``), not applicable here
(listed as notes) or unsupported (the run refuses, one line each naming why).
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from core.config.errors import ConfigError
from core.verl.script import recorded_calls, verl_overrides
from core.verl.translate import Translation, translate

BASE = Path(__file__).resolve().parent  # config.yaml: core's defaults
OUR_FLAGS = {"--dry-run": 0, "--info": 0, "--prepare-data": 0, "--cfg": 1, "--src": 1}


def split_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """Our own flags (``--dry-run``, ``--cfg job``, ...) and verl's ``key=value`` overrides."""
    flags, overrides, i = [], [], 0
    while i < len(argv):
        a = argv[i]
        if a in OUR_FLAGS:
            flags += argv[i:i + 1 + OUR_FLAGS[a]]
            i += 1 + OUR_FLAGS[a]
            continue
        if a in ("--config-name", "--config-path") and i + 1 < len(argv):  # verl's own flags, as key=value
            overrides.append(f"{a}={argv[i + 1]}")
            i += 2
            continue
        overrides.append(a)
        i += 1
    return flags, overrides


def quoted(arg: str) -> str:
    """A shell word as a person would type it: bare, or in double quotes when it holds single ones."""
    if arg == shlex.quote(arg):
        return arg
    return f'"{arg}"' if "'" in arg and not any(c in arg for c in '"$`\\!') else shlex.quote(arg)


def summary(tr: Translation) -> str:
    """One line of counts, then one note per key that has no job here."""
    kinds = [what for _, _, what in tr.lines]
    n_na, n_no = sum(k.startswith("not applicable") for k in kinds), sum(k == "unsupported" for k in kinds)
    head = (f"verl keys: {len(kinds)} given, {len(kinds) - n_na - n_no} translated, {n_na} not applicable here, "
            f"{n_no} unsupported")
    return "\n".join([head] + [f"note: {line}" for line in tr.not_applicable])


def refuse(tr: Translation, where: str = "the command line") -> None:
    if tr.unsupported:
        raise ConfigError(f"{len(tr.unsupported)} verl key(s) of {where} have no counterpart here:\n"
                          + "\n".join(f"- {line}" for line in tr.unsupported))


def run_verl(argv: list[str], plan: bool = False) -> int:
    """``hybridrl train|plan --verl <verl overrides> [our flags]``."""
    from core.run import main as run_main

    flags, overrides = split_flags(argv)
    if not overrides:
        raise ConfigError("--verl: give verl's overrides, e.g. hybridrl train --verl data.train_batch_size=8 "
                          "actor_rollout_ref.model.path=SmolLM2-135M-Instruct ...")
    tr = translate(overrides)
    print(summary(tr), flush=True)
    refuse(tr)
    return run_main((["--dry-run"] if plan else []) + flags + tr.overrides(given=True), config_dir=BASE,
                    implied=tr.overrides(given=False))


def parser() -> argparse.ArgumentParser:
    """``hybridrl convert-verl``'s arguments."""
    p = argparse.ArgumentParser(prog="hybridrl convert-verl", description="turn a verl run script into a hybridrl run: "
                                "the script runs with stand-ins for python, uv, ray, ... first on PATH (nothing is "
                                "trained or downloaded), its verl command line is translated key by key, and the "
                                "equivalent command and config are printed",
                                epilog="example:\n  hybridrl convert-verl examples/grpo_trainer/run_qwen3_8b_fsdp.sh "
                                       "--out runs/qwen3_grpo\n  then: hybridrl plan runs/qwen3_grpo",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("script", type=Path, help="verl's bash run script")
    p.add_argument("--out", type=Path, help="write <out>/config.yaml (our keys): `hybridrl train <out>` runs it")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment for the script (its ${VAR:-default}s), repeatable")
    return p


def convert(argv: list[str]) -> int:
    """``hybridrl convert-verl <run.sh> [--out DIR] [--env KEY=VALUE ...]``."""
    a = parser().parse_args(argv)
    env = dict(e.split("=", 1) for e in a.env)
    overrides, launcher = verl_overrides(recorded_calls(a.script, env), a.script)
    tr = translate(overrides)
    head = summary(tr).replace("\n", "\n# ")
    print(f"# {a.script}: `{launcher}` with {len(overrides)} overrides\n# {head}")
    for line in tr.unsupported:
        print(f"# unsupported: {line}")
    lines = " \\\n    ".join(map(quoted, overrides))
    print(f"\n# the same run from verl's keys:\nhybridrl train --verl \\\n    {lines}")
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "config.yaml").write_text(f"# converted from {a.script} by hybridrl convert-verl\n{tr.yaml()}\n")
        print(f"\n# or from our keys, written to {a.out / 'config.yaml'}:\nhybridrl train {a.out}")
    else:
        print(f"\n# or from our keys (--out DIR writes them as DIR/config.yaml; then hybridrl train DIR):\n{tr.yaml()}")
    return 1 if tr.unsupported else 0
