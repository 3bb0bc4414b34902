"""The sandbox escape table for a closing note: each case of tests/tools/escapes.py run with
``tools.isolation: process`` (rlimits and seccomp only) and with ``namespaces`` (the default), judged the same way.

Process isolation runs the attempts for real against planted targets (a decoy process stands for the worker; what an
escaped case changed is undone after it). Needs a C compiler (one case loads a shared library) and, for the
namespaces column, bubblewrap.

Usage: python bench/sandbox_escape_table.py [--only namespaces]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.tools.escapes import CASES, Targets, run_case  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=["process", "namespaces"], action="append")
    modes = p.parse_args(argv).only or ["process", "namespaces"]
    targets = Targets()
    rows = []
    try:
        for case in CASES:
            row = [case.group, case.name]
            for mode in modes:
                r, escaped, why = run_case(case, targets, mode)
                row.append(f"**escaped** ({why})" if escaped else f"contained ({r.status})")
                targets.reset()
            rows.append(row)
            print(" | ".join(row), file=sys.stderr, flush=True)
    finally:
        targets.close()
    print("| group | case | " + " | ".join(modes) + " |\n|" + "---|" * (2 + len(modes)))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    for mode, col in zip(modes, range(2, 2 + len(modes))):
        n = sum(r[col].startswith("**escaped") for r in rows)
        print(f"\n{mode}: {n} of {len(rows)} escaped")


if __name__ == "__main__":
    main()
