"""``hybridrl plan <recipe> --config-name <yaml> [overrides]`` in the test's process (a plan starts nothing): the
exit code and what it printed. Each run script is a thin ``hybridrl train`` of one yaml (test_recipe_configs.py
holds every script to that), so planning the yaml is planning the script."""

from __future__ import annotations


def plan(capsys, recipe: str, config_name: str, *overrides: str) -> tuple[int, str]:
    from core.cli import main

    capsys.readouterr()
    rc = main(["plan", recipe, "--config-name", config_name, *overrides])
    got = capsys.readouterr()
    return rc, got.out + got.err
