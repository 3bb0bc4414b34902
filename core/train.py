"""``python -m core.train --config-dir recipes/grpo [--config-name config] [key=value ...]``.

The recipe's Hydra config, with any Hydra overrides from the command line, is validated once into
``core.trainer.RunConfig`` (unknown keys and wrong types fail naming the key) and handed to ``fit``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from core.checks import check_run
from core.config import validate
from core.planner import plan_run
from core.trainer import RunConfig, effective_sizes, fit


def load_run_config(config_dir: str | Path, config_name: str = "config", overrides: list[str] | None = None,
                    schema: type = RunConfig) -> RunConfig:
    """The recipe's Hydra config composed with ``overrides``, validated into ``schema`` (a recipe whose loop
    differs passes its own dataclass that extends RunConfig with its section)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    config_dir = Path(config_dir).resolve()
    if not (config_dir / f"{config_name}.yaml").is_file():
        raise FileNotFoundError(f"no {config_name}.yaml in {config_dir}")
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        tree = compose(config_name=config_name, overrides=list(overrides or []))
    return validate(schema, OmegaConf.to_container(tree, resolve=True), where=str(config_dir / f"{config_name}.yaml"))


def main(argv: list[str] | None = None, schema: type = RunConfig, make_step: Callable | None = None) -> int:
    """The CLI; a recipe with its own loop calls it with its config ``schema`` and ``make_step(cfg) -> step_fn``."""
    p = argparse.ArgumentParser(prog="python -m core.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--config-dir", required=True, help="the recipe folder holding config.yaml")
    p.add_argument("--config-name", default="config")
    p.add_argument("--dry-run", action="store_true",
                   help="validate the config, print the effective batch sizes and the capacity plan (core.planner); "
                        "start nothing; exit 1 when the plan does not fit")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. trainer.total_steps=5 actor.optim.lr=1e-5")
    a = p.parse_intermixed_args(argv)
    cfg = load_run_config(a.config_dir, a.config_name, a.overrides, schema)
    check_run(cfg)  # sections that disagree fail here, before the plan or Ray
    if a.dry_run:
        pool = cfg.placement.pools[cfg.placement.roles["actor"]]
        dp = 1 if cfg.trainer.backend == "local" else pool.nnodes * pool.slots_per_node
        print(f"config valid: actor {cfg.actor.model} on {dp} {pool.device} rank(s)\neffective sizes:\n"
              + effective_sizes(cfg, dp))
        text, fits = plan_run(cfg)
        print(text)
        return 0 if fits else 1
    fit(cfg, make_step(cfg) if make_step else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
