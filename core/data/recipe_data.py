"""A recipe's datasets, and writing the ones a run names that are not there yet.

A recipe's ``data.py`` defines ``DATASETS = {folder: Dataset(...)}``: ``folder`` is the folder under the data
root that its yamls name (``data.train_files: [outputs/data/gsm8k/train.parquet]`` -> ``gsm8k``), and the
dataset's ``write(out, src)`` writes ``<out>/<folder>/*.parquet``. Three ways in, one code path:

    hybridrl train grpo --config-name config          writes what config.yaml names and is missing, then runs
    hybridrl data prepare grpo --config-name config   only that (``--src gsm8k=DIR|hub|FILE``)
    python recipes/grpo/data.py gsm8k --src hub       one dataset by name (``--help`` lists them)

``src``: where a dataset reads from -- None is the dataset's own default (a local copy in ``../shared/data``
beside the checkout when there is one, else the Hugging Face hub; ``core.data.prepare``), or a folder, a file,
or ``hub``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


@dataclass(frozen=True)
class Dataset:
    # (data root, src or None) -> writes <root>/<folder>/<split>.parquet
    write: Callable[[Path, str | None], Any]
    # what it holds and where it comes from, one line (``data.py --help``, ``hybridrl data prepare``)
    about: str


def recipe_datasets(recipe: Path) -> dict[str, Dataset]:
    """The ``DATASETS`` of ``<recipe>/data.py`` (imported by path: recipes are folders, not packages); {} when the
    recipe has no data.py."""
    path = Path(recipe) / "data.py"
    if not path.is_file():
        return {}
    spec = importlib.util.spec_from_file_location(f"recipe_{Path(recipe).name}_data", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, "DATASETS", {})


def named_files(cfg) -> list[tuple[str, Path]]:
    """(key, path) of every data file the run reads: ``data.train_files[i]``, ``data.val_files[i]``."""
    return [(f"data.{key}[{i}]", Path(p)) for key in ("train_files", "val_files")
            for i, p in enumerate(getattr(cfg.data, key))]


def missing(cfg, datasets: dict[str, Dataset]) -> dict[str, list[tuple[str, Path]]]:
    """The datasets a run needs that are not all there: {folder: [(key, path) missing]}; a missing file whose folder
    is no dataset of the recipe under ``None``."""
    out: dict[str, list[tuple[str, Path]]] = {}
    for key, path in named_files(cfg):
        if not path.is_file():
            out.setdefault(path.parent.name if path.parent.name in datasets else None, []).append((key, path))
    return out


def prepare_named(recipe: Path, datasets: dict[str, Dataset], cfg, srcs: dict[str | None, str] | None = None,
                  say: Callable[[str], None] = print) -> list[str]:
    """Write each of ``datasets`` (the recipe's, ``recipe_datasets``) that ``cfg`` names and is missing, into the
    data root of the missing files; returns the folders written. ``srcs``: {folder: src}, and {None: src} for every dataset. A folder where the config names a file that
    is there already is not written (a dataset writes all its splits: it would replace that file); a missing file no
    dataset of the recipe writes is left for ``core.checks`` to name."""
    from core.config.errors import ConfigError, did_you_mean

    srcs = srcs or {}
    for name in (n for n in srcs if n is not None and n not in datasets):
        raise ConfigError(f"--src {name}=...: {recipe.name}'s data.py has no dataset {name!r}"
                          f"{did_you_mean(name, datasets)} (its datasets: {', '.join(datasets) or 'none'})", "--src")
    gaps = {k: v for k, v in missing(cfg, datasets).items() if k is not None}  # the rest: check_files names them
    present = {p.parent for _, p in named_files(cfg) if p.is_file()}
    written = []
    for folder in sorted(gaps):
        for root in sorted({p.parent.parent for _, p in gaps[folder]}):
            if root / folder in present:
                continue  # partly there: check_files names what is missing
            src = srcs.get(folder, srcs.get(None))
            say(f"data: writing {root / folder}/ -- {datasets[folder].about}" + (f"; from {src}" if src else ""))
            datasets[folder].write(root, src)
            written.append(folder)
    return written


def parse_srcs(values: list[str] | None) -> dict[str | None, str]:
    """``--src DIR`` (every dataset) and ``--src NAME=SRC`` (one) -> {None: DIR, NAME: SRC}."""
    out: dict[str | None, str] = {}
    for v in values or []:
        name, sep, src = v.partition("=")
        out[name if sep and "/" not in name else None] = src if sep and "/" not in name else v
    return out


def data_cli(datasets: dict[str, Dataset], doc: str, argv: list[str] | None = None) -> int:
    """A recipe's ``python data.py NAME [NAME ...] [--src ...] [--out DIR]``: write the named datasets."""
    lines = "\n".join(f"  {name:<14} {d.about}" for name, d in datasets.items())
    p = argparse.ArgumentParser(prog=f"python {sys.argv[0]}", description=doc.split("\n\n")[0].replace("``", "`"),
                                epilog=f"datasets:\n{lines}\n\nthe ones a config names: hybridrl data prepare <recipe> "
                                       "--config-name NAME", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="+", choices=sorted(datasets), metavar="NAME", help="datasets to write (below)")
    p.add_argument("--src", action="append", metavar="[NAME=]SRC",
                   help="where to read: DIR, FILE or hub, for every named dataset, or "
                   "NAME=SRC for one (repeatable); default: each dataset's own (below)")
    p.add_argument("--out", default="outputs/data", help="the data root: writes <out>/<NAME>/*.parquet "
                   "(default: outputs/data)")
    a = p.parse_args(argv)
    srcs = parse_srcs(a.src)
    for name in a.names:
        datasets[name].write(Path(a.out), srcs.get(name, srcs.get(None)))
    return 0
