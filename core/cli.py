"""hybridrl <command> (or python -m core.cli <command>): one entry point for what users run.

    hybridrl train grpo --config-name demo_cpu trainer.total_steps=5    run a recipe (its train.py)
    hybridrl plan dapo --config-name qwen32b trainer.nnodes=8           its memory plan, nothing started
    hybridrl new myalgo --from grpo                                     copy a recipe as a new algorithm
    hybridrl eval --model SmolLM2-135M-Instruct --data gsm8k --limit 50  score a model on a benchmark
    hybridrl export outputs/run/checkpoints/step_000020 outputs/hf      a checkpoint as a HF folder
    hybridrl selfcheck                                                   start the worker groups, check the runtime
    hybridrl recipes                                                     the recipes and what each reproduces
    hybridrl config show grpo --config-name demo_cpu actor.optim.lr=2e-6 the resolved, validated config
    hybridrl report outputs/grpo_smollm2_cpu                             a run's summary and curves.png
    hybridrl compare grpo=outputs/a distill=outputs/b --png cmp.png      runs' held-out scores side by side
    hybridrl data prepare grpo --config-name config                      write the data a config names
    hybridrl train --verl data.train_batch_size=8 actor_rollout_ref.rollout.n=4 ...   a run from verl's keys
    hybridrl convert-verl verl/examples/grpo_trainer/run_qwen3_8b_fsdp.sh             a verl script, translated

``<recipe>`` is a folder, or a name under ``recipes/`` (of the working directory, else of this repository).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

EXAMPLES = {
    "train": "hybridrl train grpo --config-name demo_cpu trainer.total_steps=5\n"
             "hybridrl train recipes/myalgo --dry-run\n"
             "hybridrl train --verl <verl's overrides>   (verl's keys and semantics: docs/coming-from-verl.md)\n"
             "  (arguments after the recipe: --config-name, --dry-run, Hydra overrides; `hybridrl train grpo --help`)",
    "plan": "hybridrl plan dapo --config-name qwen32b trainer.nnodes=8\n"
            "  (the same as `hybridrl train <recipe> --dry-run`: exit 1 when the plan does not fit)",
    "new": "hybridrl new myalgo --from grpo\n"
           "  (copies recipes/grpo to recipes/myalgo, points it at itself, resets expected.yaml, runs 2 tiny steps)",
    "eval": "hybridrl eval --model SmolLM2-135M-Instruct --data gsm8k --limit 50 --temperature 0\n"
            "  (all options: `hybridrl eval --help`)",
    "export": "hybridrl export outputs/grpo_smollm2_cpu/checkpoints/step_000020 outputs/hf --dtype bfloat16",
    "selfcheck": "hybridrl selfcheck --workers 2 --split",
    "recipes": "hybridrl recipes",
    "config": "hybridrl config show grpo --config-name demo_cpu actor.optim.lr=2e-6",
    "data": "hybridrl data prepare grpo --config-name config\n"
            "hybridrl data prepare dapo --config-name qwen32b --src dapo_math=/data/dapo-math-17k.parquet\n"
            "  (writes each missing file data.train_files / data.val_files name, as the recipe's data.py does;\n"
            "  `python recipes/<recipe>/data.py --help` lists its datasets and their sources)",
    "convert-verl": "hybridrl convert-verl verl/examples/grpo_trainer/run_qwen3_8b_fsdp.sh --out runs/qwen3_grpo\n"
                    "  (`hybridrl train --verl <verl overrides>` runs verl's keys directly; docs/coming-from-verl.md)",
    "report": "hybridrl report outputs/grpo_smollm2_cpu   (a finished or running run: its folder or metrics.jsonl)",
    "compare": "hybridrl compare grpo=outputs/distill_teacher_cpu distill=outputs/distill_smollm2_cpu --png cmp.png\n"
               "  (each run: name=its folder or metrics.jsonl; all options: `hybridrl compare --help`)",
}


def recipe_dir(name: str) -> Path:
    """A recipe folder from a path or a name under recipes/ (working directory first, then this repository)."""
    for path in (Path(name), Path("recipes") / name, ROOT / "recipes" / name):
        if (path / "config.yaml").is_file():
            return path.resolve()
    known = sorted(p.parent.name for p in (ROOT / "recipes").glob("*/config.yaml"))
    raise SystemExit(f"hybridrl: no recipe {name!r} (a folder with config.yaml); recipes here: {', '.join(known)}")


def recipe_module(folder: Path, name: str = "train"):
    """A recipe's ``<name>.py`` imported by path (recipes are folders, not packages)."""
    spec = importlib.util.spec_from_file_location(f"recipe_{folder.name}_{name}", folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def run_recipe(folder: Path, argv: list[str]) -> int:
    """The recipe's own ``train.py`` ``main(argv)`` when it has one, else core's run with its config."""
    if not (folder / "train.py").is_file():
        from core.run import main

        return main(argv, config_dir=folder)
    return recipe_module(folder).main(argv)


def main(argv: list[str] | None = None) -> int:
    """The ``hybridrl`` command: a user's mistake is one line on stderr and exit code 2 (``--debug``: a traceback)."""
    from core.config.errors import answer_user_errors

    return answer_user_errors(_main, list(sys.argv[1:] if argv is None else argv))


def parser() -> argparse.ArgumentParser:
    """The ``hybridrl`` parser (eval, export, convert-verl and compare parse their own arguments: ``core.eval.parser``
    ...)."""
    parser = argparse.ArgumentParser(prog="hybridrl", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n")[1], formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, description=text, epilog="example:\n  " + EXAMPLES[name].replace(
            "\n", "\n  "), formatter_class=argparse.RawDescriptionHelpFormatter,
            add_help=name not in ("eval", "export", "convert-verl", "compare"))

    for name, text in (("train", "run a recipe: its train.py with its config.yaml and your overrides"),
                       ("plan", "validate a recipe's config and print its capacity plan; start nothing")):
        p = command(name, text)
        p.add_argument("recipe", help="a folder, or a name under recipes/; or --verl, then verl's overrides")
        p.add_argument("args", nargs=argparse.REMAINDER, help="--config-name, --dry-run, Hydra overrides")
    p = command("new", "copy a recipe as the start of a new algorithm")
    p.add_argument("name", help="the new recipe's name (a folder beside the source recipe)")
    p.add_argument("--from", dest="source", required=True, help="the recipe to copy (a folder or a name)")
    p.add_argument("--no-check", action="store_true", help="skip the 2-step run of the copy on a tiny model")
    for name, text in (("eval", "score a model on a benchmark (core.eval)"),
                       ("export", "write a checkpoint as a Hugging Face folder (core.export)"),
                       ("convert-verl", "translate a verl run script into a hybridrl run (core.verl)"),
                       ("compare", "runs' held-out scores side by side, at equal steps and equal time (core.compare)")):
        command(name, text).add_argument("args", nargs=argparse.REMAINDER)
    check = command("selfcheck", "place the roles on Ray (or locally) and check dispatch and collectives")
    check.add_argument("--backend", choices=["ray", "local"], default="ray",
                       help="ray: worker processes on a local Ray; local: every role in this process (default: ray)")
    check.add_argument("--workers", type=int, default=2, help="ranks per pool (default: 2)")
    check.add_argument("--split", action="store_true", help="put the reference on its own pool instead of colocating")
    command("recipes", "list the recipes, each with what it reproduces (its expected.yaml tiers)")
    config = command("config", "show a recipe's resolved config (validated, every default filled in)")
    config.add_argument("action", choices=["show"])
    config.add_argument("recipe", help="a folder, or a name under recipes/")
    config.add_argument("args", nargs=argparse.REMAINDER, help="--config-name NAME, Hydra overrides")
    data = command("data", "write the data files a recipe's config names that are missing (its data.py)")
    data.add_argument("action", choices=["prepare"], help="prepare: write what is missing")
    data.add_argument("recipe", help="a folder, or a name under recipes/")
    data.add_argument("args", nargs=argparse.REMAINDER,
                      help="--config-name NAME, --src [NAME=]SRC (DIR, FILE or hub; repeatable), Hydra overrides")
    report = command("report", "a run's summary and its curves (curves.png beside metrics.jsonl)")
    report.add_argument("run", type=Path, help="the run's output folder, or its metrics.jsonl")
    return parser


def _main(argv: list[str]) -> int:
    if argv[:1] in (["eval"], ["export"], ["convert-verl"], ["compare"]):  # their own parsers own every option
        args = argparse.Namespace(command=argv[0], args=argv[1:])
    elif argv[:1] in (["train"], ["plan"]) and argv[1:2] == ["--verl"]:
        from core.verl.run import run_verl

        return run_verl(argv[2:], plan=argv[0] == "plan")
    else:
        args = parser().parse_args(argv)

    if args.command in ("train", "plan"):
        return run_recipe(recipe_dir(args.recipe), (["--dry-run"] if args.command == "plan" else []) + args.args)
    if args.command == "new":
        from core.scaffold import new_recipe

        new_recipe(args.name, recipe_dir(args.source), check=not args.no_check)
        return 0
    if args.command == "recipes":
        print(recipes_table())
        return 0
    if args.command == "config":
        return _config_show(recipe_dir(args.recipe), args.args)
    if args.command == "data":
        return run_recipe(recipe_dir(args.recipe), ["--prepare-data", *args.args])
    if args.command == "report":
        from core.report import main as report_main

        return report_main([str(args.run / "metrics.jsonl" if args.run.is_dir() else args.run)])
    if args.command == "eval":
        from core.eval import main as eval_main

        return eval_main(args.args)
    if args.command == "convert-verl":
        from core.verl.run import convert

        return convert(args.args)
    if args.command == "export":
        from core.export import main as export_main

        return export_main(args.args)
    if args.command == "compare":
        from core.compare import main as compare_main

        return compare_main(args.args)
    return _selfcheck(args)


def recipes_table() -> str:
    """One block per recipe: its name and first README line, then each tier of its expected.yaml with the script
    that runs it and the bounds it must meet."""
    from core.expected import load_expected

    out = []
    for folder in sorted(p.parent for p in (ROOT / "recipes").glob("*/config.yaml")):
        readme = folder / "README.md"
        title = next((line.strip("#* ").strip() for line in readme.read_text().splitlines()[1:] if line.strip()),
                     "") if readme.is_file() else ""
        title = title.replace("**", "").replace("*", "")
        paper = re.search(r"arXiv:\d+\.\d+", title)
        name = re.split(r" \(|: |\. ", title)[0]
        out.append(f"{folder.name}: {name}{f' ({paper.group()})' if paper else ''}")
        for tier, t in load_expected(folder).items():
            bounds = ", ".join(f"{k} {'>=' if 'min' in b else '<='} {b.get('min', b.get('max'))}"
                               for k, b in (t.get("bounds") or {}).items())
            out.append(f"  {tier:<16} {t.get('run', '')}: {bounds}")
    return "\n".join(out)


def _config_show(folder: Path, argv: list[str]) -> int:
    """``hybridrl config show <recipe> [--config-name X] [overrides]``: the run's ``--cfg job``."""
    return run_recipe(folder, ["--cfg", "job", *argv])


def _selfcheck(args: argparse.Namespace) -> int:
    from core.config import PlacementConfig, PoolConfig
    from core.selfcheck import selfcheck

    pools = {"main": PoolConfig(slots_per_node=args.workers)}
    roles = {"actor": "main", "rollout": "main", "ref": "main"}
    if args.split:
        pools["ref"], roles["ref"] = PoolConfig(slots_per_node=args.workers), "ref"
    if args.backend == "ray":
        from core.worker_group import init_ray

        init_ray(num_cpus=max(2, len(pools) * args.workers))
    return 0 if selfcheck(PlacementConfig(pools, roles), args.backend) else 1


if __name__ == "__main__":
    sys.exit(main())
