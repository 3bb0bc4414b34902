"""Run a recipe: its Hydra config (``config.yaml`` or ``--config-name``) with your overrides, validated once.

    hybridrl train <recipe> [--config-name NAME] [--dry-run] [key=value ...]     (core.cli; the recipe's train.py)
    python -m core.run --config-dir <recipe folder> [...]                       (core's step, no recipe code)

The config is validated into ``core.config.RunConfig`` (unknown keys and wrong types fail naming the key), a
recipe's own sections into its dataclasses, the sections' agreement checked (``core.checks``), then ``fit``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any, Callable

from core.checks import check_files, check_run
from core.config import RunConfig, reads, validate
from core.config.errors import ConfigError, answer_user_errors, override_key, with_sources
from core.data.recipe_data import missing, parse_srcs, prepare_named, recipe_datasets
from core.plan_report import dp_size, effective_sizes, plan_run
from core.preemption import EXIT_PREEMPTED, Preempted
from core.trainer import fit


_ABSENT = object()


def load_run_config(config_dir: str | Path, config_name: str = "config", overrides: list[str] | None = None
                    ) -> RunConfig:
    """The recipe's Hydra config composed with ``overrides``, validated into ``RunConfig``."""
    return load_recipe_config(config_dir, config_name, overrides)[0]


def load_recipe_config(config_dir: str | Path, config_name: str = "config", overrides: list[str] | None = None,
                       sections: dict[str, type] | None = None) -> tuple[RunConfig, dict[str, Any]]:
    """``load_run_config`` for a recipe with sections of its own (DAPO's ``dapo:``): each is taken out of the tree
    and validated into its dataclass, the rest into ``RunConfig``. Returns (run config, {section: dataclass}).
    A relative ``reward.path`` is the recipe folder's file (a copied recipe uses its own reward), else the
    working directory's."""
    cfg, extra, _ = load_with_given(config_dir, config_name, overrides, sections)
    return cfg, extra


def load_with_given(config_dir: str | Path, config_name: str = "config", overrides: list[str] | None = None,
                    sections: dict[str, type] | None = None) -> tuple[RunConfig, dict[str, Any], reads.Given]:
    """``load_recipe_config``, and the keys the yamls and ``overrides`` set (``reads.Given``: a run warns of those
    it never reads)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    config_dir = Path(config_dir).resolve()
    where = str(config_dir / f"{config_name}.yaml")
    if not (config_dir / f"{config_name}.yaml").is_file():
        raise FileNotFoundError(f"no {config_name}.yaml in {config_dir}")
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        base = compose(config_name=config_name)
        # a key the yaml does not spell out (a default of the schema, or a typo) is added, not refused by Hydra:
        # validation then takes the schema's value or names the typo with the keys that exist
        user_overrides = list(overrides or [])
        overrides = [f"++{o}" if "=" in o and o[0] not in "+~" and
                     OmegaConf.select(base, o.split("=", 1)[0], default=_ABSENT) is _ABSENT else o
                     for o in overrides or []]
        composed = compose(config_name=config_name, overrides=overrides)
    as_written = OmegaConf.to_container(composed, resolve=False)
    tree = OmegaConf.to_container(composed, resolve=True)
    reward = tree.get("reward") or {}
    if reward.get("path") and not Path(reward["path"]).is_absolute() and (config_dir / reward["path"]).is_file():
        reward["path"] = str(config_dir / reward["path"])
    agent = ((tree.get("rollout") or {}).get("agent") or {})
    runner, _, fn = str(agent.get("runner") or "").rpartition(":")
    if runner.endswith(".py") and not Path(runner).is_absolute() and (config_dir / runner).is_file():
        agent["runner"] = f"{config_dir / runner}:{fn}"  # a recipe's agent program, as its reward file
    try:
        extra = {name: validate(cls, tree.pop(name, None), where=where, prefix=name)
                 for name, cls in (sections or {}).items()}
        cfg = validate(RunConfig, tree, where=where)
    except ConfigError as e:
        raise with_sources(e, user_overrides, where) from None
    given = reads.Given(frozenset(reads.given_keys(as_written)), frozenset(reads.interpolated(as_written)),
                        tuple(user_overrides), tuple(map(str, yaml_chain(config_dir, config_name))), extra)
    return cfg, extra, given


def config_yaml(cfg: RunConfig, extra: dict[str, Any] | None = None) -> str:
    """The validated config as YAML under its yaml keys (``trainer.async``), a recipe's own sections after it."""
    import dataclasses

    import yaml

    def plain(v):
        if isinstance(v, dict):
            return {(k[:-1] if isinstance(k, str) and k.endswith("_") else k): plain(x) for k, x in v.items()}
        return [plain(x) for x in v] if isinstance(v, (list, tuple)) else v

    tree = dataclasses.asdict(cfg) | {k: dataclasses.asdict(v) for k, v in (extra or {}).items()}
    return yaml.safe_dump(plain(tree), sort_keys=False, width=120).rstrip()


def yaml_chain(config_dir: Path, config_name: str) -> list[Path]:
    """The yaml files a config composes, the named one first, then the one its ``defaults`` names, and so on."""
    import yaml

    chain, name = [], config_name
    while name and name not in chain:
        chain.append(name)
        text = yaml.safe_load((Path(config_dir) / f"{name}.yaml").read_text()) or {}
        parents = [d for d in text.get("defaults", []) if isinstance(d, str) and d != "_self_"]
        name = parents[0] if parents else None
    return [Path(config_dir) / f"{n}.yaml" for n in chain]


def config_info(config_dir: Path, config_name: str, overrides: list[str]) -> str:
    """Where a run's config comes from: the yaml files in the order they compose, then the command line."""
    files = ["core's defaults (core/config/)"] + [str(p) for p in reversed(yaml_chain(config_dir, config_name))]
    return ("config, each layer over the one before:\n" + "\n".join(f"  {f}" for f in files)
            + f"\n  command line: {' '.join(overrides) if overrides else '(nothing)'}")


def data_hint(recipe: Path, datasets: dict, config_name: str, cfg: RunConfig) -> str:
    """What to do about a missing data file: the command that writes it, or which ``datasets`` the recipe can
    write."""
    if not datasets:
        return ""
    gaps = missing(cfg, datasets)
    if None in gaps:
        return (f"{recipe.name}'s data.py writes {', '.join(f'{d}/' for d in datasets)} under a data folder, not "
                f"{gaps[None][0][1].parent.name}/")
    who = recipe.name if recipe.parent.name == "recipes" else str(recipe)
    name = "" if config_name == "config" else f" --config-name {config_name}"
    return f"`hybridrl data prepare {who}{name}` writes it (a run does that itself)"


def _shown(path) -> str:
    """A path as a user reads it: relative to the working directory when it is under it."""
    path = Path(path).resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def main(argv: list[str] | None = None, *, config_dir: str | Path | None = None,
         sections: dict[str, type] | None = None, make_step: Callable | None = None,
         implied: list[str] | None = None, sizes: Callable | None = None) -> int:
    """The CLI of a run. A recipe's ``train.py`` calls it with its folder, its own config ``sections`` and
    ``make_step(cfg, sections) -> step_fn`` (its copy of the step, ``core.trainer.fit``'s ``step_fn``);
    ``sizes(cfg, sections, dp) -> text``: its step's batch sizes in words, where they are not the RL step's (SFT). ``implied``:
    overrides a front end derives rather than the user gives (verl's defaults, ``core.verl``): applied with the
    command line's (the two never share a key), never warned of as unread."""
    p = argparse.ArgumentParser(prog="hybridrl train <recipe>", description=__doc__.split("\n\n")[0].replace("``", "`"),
                                epilog="example:\n  hybridrl train grpo --config-name demo_cpu trainer.total_steps=5 "
                                       "actor.optim.lr=1e-5\n\na mistake is one line on stderr, exit code 2; --debug "
                                       "(or HYBRIDRL_DEBUG=1) shows its traceback",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config-dir", required=config_dir is None, default=config_dir,
                   help="the recipe folder holding config.yaml"
                        + (f" (default {_shown(config_dir)})" if config_dir else ""))
    p.add_argument("--config-name", default="config",
                   help="the yaml of the recipe folder to run, without .yaml (default: config)")
    p.add_argument("--dry-run", action="store_true",
                   help="validate the config, print the effective batch sizes and the capacity plan (core.planner); "
                        "start nothing; exit 1 when the plan does not fit")
    p.add_argument("--time", metavar="HARDWARE",
                   help="with --dry-run (hybridrl plan): predict the step time of sync, one_step_off and streaming on "
                        "HARDWARE -- h100, h200, a100 (data sheets, core.time_plan) or a yaml of measured costs")
    p.add_argument("--lengths", metavar="SPEC",
                   help="with --time: the response lengths, lognormal:median=M,sigma=S, a file of one length per "
                        "line, or a run's output folder (its lengths.jsonl) (default: lognormal, median an eighth of "
                        "algo.sampling.max_new_tokens, sigma 1)")
    p.add_argument("--cfg", choices=["job", "hydra", "all"],
                   help="Hydra's flag: print the run's resolved config (every default filled in) and exit")
    p.add_argument("--info", action="store_true", help="Hydra's flag: where the config comes from, and exit")
    p.add_argument("-m", "--multirun", action="store_true", help="Hydra's sweeps: not supported (one run per call)")
    p.add_argument("--prepare-data", action="store_true",
                   help="write the data files the config names that are missing (the recipe's data.py), and exit; "
                        "a run does this itself before it starts (hybridrl data prepare <recipe>)")
    p.add_argument("--src", action="append", metavar="[NAME=]SRC",
                   help="where missing data is read from: DIR, FILE or hub, for every dataset, or NAME=SRC for one "
                        "(repeatable); default: each dataset's own (`python <recipe>/data.py --help`)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. trainer.total_steps=5 actor.optim.lr=1e-5")
    a = p.parse_intermixed_args(argv)
    if (a.time or a.lengths) and not a.dry_run:
        raise ConfigError("--time and --lengths predict a run's step time: with --dry-run (hybridrl plan <recipe> "
                          "--time h100), not with a run")
    if a.multirun:
        raise ConfigError("--multirun: a sweep is one `hybridrl train` per setting here (each run owns its Ray "
                          "cluster and output_dir); loop over them in the shell or submit each as a job")
    if a.cfg == "hydra":
        raise ConfigError("--cfg hydra: runs use no Hydra runtime config (no working-dir switch, logging or launcher "
                          "settings); --cfg job prints the run's config")
    cfg, extra, given = load_with_given(a.config_dir, a.config_name, list(implied or []) + a.overrides, sections)
    if implied:
        given = dataclasses.replace(given, keys=given.keys - {override_key(o) for o in implied})
    if a.cfg or a.info:
        print(config_info(Path(a.config_dir), a.config_name, a.overrides) if a.info else config_yaml(cfg, extra))
        return 0
    recipe = Path(a.config_dir)
    datasets = recipe_datasets(recipe)  # its data.py, imported once
    hint = data_hint(recipe, datasets, a.config_name, cfg)
    try:  # (a run checks again in fit, before anything loads)
        check_run(cfg, own_step=make_step is not None)  # sections that disagree fail here, before the plan
        if not a.dry_run:  # the data the config names that is missing, as the recipe's data.py writes it
            prepare_named(recipe, datasets, cfg, parse_srcs(a.src))
            if a.prepare_data:
                check_files(cfg, data_hint=hint)  # what is still missing is named, exit code 2
                return 0
        missing = check_files(cfg, missing_data_ok=a.dry_run, data_hint=hint)  # a run stops on missing data
    except ConfigError as e:
        raise with_sources(e, a.overrides, recipe / f"{a.config_name}.yaml") from None
    if a.dry_run:
        for m in missing:
            print(f"warning: {m}")
        dp, device = dp_size(cfg), cfg.placement.pools[cfg.placement.roles["actor"]].device
        print(f"config valid: actor {cfg.actor.model} on {dp} {device} rank(s)\neffective sizes:\n"
              + (sizes(cfg, extra, dp) if sizes else effective_sizes(cfg, dp)))
        text, fits = plan_run(cfg)
        print(text)
        if a.time:  # the step time too (core.time_plan): the three async modes on the config's placement
            from core.time_plan import time_report

            print("\n" + time_report(cfg, a.time, a.lengths or ""))
        return 0 if fits else 1
    text = sizes(cfg, extra, dp_size(cfg)) if sizes else None  # before recording: printing a key is no use of it
    reads.label(cfg)  # from here to the end of the first step, every key read is recorded (core.config.reads)
    for name, section in extra.items():
        reads.label(section, name)
    reads.start(cfg, extra)
    try:
        fit(cfg, make_step(cfg, extra) if make_step else None, given, sizes=text)
    except Preempted as e:  # a scheduler's SIGTERM / SIGUSR1: checkpointed (or abandoned), exit 75 = requeue me
        print(f"hybridrl: {e}", file=sys.stderr, flush=True)
        return EXIT_PREEMPTED
    finally:
        reads.stop()  # a run that stops before its first step leaves no hooks in this process
    return 0


if __name__ == "__main__":
    sys.exit(answer_user_errors(main, sys.argv[1:], prog="python -m core.run"))
