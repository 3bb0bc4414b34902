"""``python -m core.data.prepare <dataset> [--src DIR|hub] [--out DIR] [--template T]`` -> verl-schema parquet.

Each row:  data_source, prompt (chat list), ability, reward_model {style, ground_truth}, extra_info {split,
index, question, ...} -- the schema verl's own preprocessing writes, so files made for verl load unchanged and
ours load in verl. Sources: by default (no ``--src``) the local copy ``DEFAULT_SRC/<name>/<split>.jsonl`` when it
exists (``../shared/data`` beside the checkout; the environment variable ``HYBRIDRL_DATA_SRC`` names another
folder), else the Hugging Face hub (needs the ``datasets`` package and a network); ``--src DIR`` reads only
``DIR/<name>/<split>.jsonl``, ``--src hub`` only the hub. Where neither can be read the error is one line naming the
dataset, the split, the file looked for and the flag to pass.

The prompt template belongs to the recipe: ``--template`` is a format string over the record (``{question}``)
or ``@path/to/template.txt``; the default is the bare question.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from core.config.errors import ConfigError, answer_user_errors
from core.rewards.gsm8k import ground_truth_from_solution
from core.rewards.math_answer import last_boxed

# the raw jsonl datasets' folder when no --src is given: ../shared/data beside the checkout, or HYBRIDRL_DATA_SRC
DEFAULT_SRC = Path(os.environ.get("HYBRIDRL_DATA_SRC") or Path(__file__).resolve().parents[3] / "shared" / "data"
                   ).expanduser()
SRC_HELP = ("folder holding <dataset>/<split>.jsonl, or 'hub' (default: ../shared/data beside the checkout when it "
            "holds the dataset, else the Hugging Face hub (needs `datasets` and a network)); HYBRIDRL_DATA_SRC=DIR in "
            "the environment changes that default folder"
            + (f" (set: {DEFAULT_SRC})" if os.environ.get("HYBRIDRL_DATA_SRC") else ""))


def _number(x: Any) -> str:
    """27.0 -> '27'; 2.5 -> '2.5'."""
    f = float(x)
    return str(int(f)) if f.is_integer() else str(f)


def _boxed(solution: str) -> str:
    ans = last_boxed(solution)
    if ans is None:
        raise ValueError("solution has no \\boxed{} answer")
    return ans


@dataclass(frozen=True)
class DatasetSpec:
    data_source: str                      # the reward registry key
    splits: tuple[str, ...]               # file stems under <src>/<name>/
    question_keys: tuple[str, ...]        # first key present holds the question
    answer: Callable[[dict], str]         # record -> ground truth string
    hub: tuple[str, str | None]           # (HF id, config) for --src hub
    ability: str = "math"


DATASETS: dict[str, DatasetSpec] = {
    "gsm8k": DatasetSpec("openai/gsm8k", ("train", "test"), ("question",),
                         lambda r: ground_truth_from_solution(r["answer"]), ("openai/gsm8k", "main")),
    # MATH (Hendrycks et al. 2021): 7,500 train / 5,000 test problems, answers in \boxed{} (verl's SPPO recipe trains on it)
    "math": DatasetSpec("lighteval/MATH", ("train", "test"), ("problem",), lambda r: _boxed(r["solution"]),
                        ("DigitalLearningGmbH/MATH-lighteval", "default")),
    "minerva_math": DatasetSpec("minerva_math", ("test",), ("problem",), lambda r: _boxed(r["solution"]),
                                ("math-ai/minervamath", None)),
    "aime24": DatasetSpec("aime24", ("test",), ("problem", "question"), lambda r: _number(r["answer"]),
                          ("HuggingFaceH4/aime_2024", None)),
    "amc23": DatasetSpec("amc23", ("test",), ("question", "problem"), lambda r: _number(r["answer"]),
                         ("math-ai/amc23", None)),
}


def read_records(name: str, split: str, src: str | Path | None = None) -> tuple[list[dict], str]:
    """Raw records of one split and a label naming where they came from (for error messages). ``src``: a folder
    holding ``<name>/<split>.jsonl``, ``"hub"``, or None: ``DEFAULT_SRC``'s copy when it has the file, else the hub.
    What cannot be read is a ``ConfigError`` of one line naming the dataset, the split, the file and ``--src``."""
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; known: {', '.join(sorted(DATASETS))}")
    if src is None:
        path = DEFAULT_SRC / name / f"{split}.jsonl"
        if path.is_file():
            return read_jsonl(path), str(path)
        return _read_hub(name, split, looked=path)
    if str(src) == "hub":
        return _read_hub(name, split)
    path = Path(src) / name / f"{split}.jsonl"
    if not path.is_file():
        raise ConfigError(f"{name} {split}: no file {path} (pass --src DIR holding {name}/{split}.jsonl, or --src hub)",
                          key="--src")
    return read_jsonl(path), str(path)


def _read_hub(name: str, split: str, looked: Path | None = None) -> tuple[list[dict], str]:
    """One split from the HF hub (or the ``datasets`` cache); ``looked``: the local file that was not there."""
    hub_id, config = DATASETS[name].hub
    missing = f"no local copy at {looked} and " if looked is not None else ""
    rows = _hub_rows(hub_id, config, split, lambda why: ConfigError(
        f"{name} {split}: {missing}the hub is unreachable ({why}); pass --src DIR holding {name}/{split}.jsonl",
        key="--src"))
    return rows, f"hub:{hub_id}[{split}]"


def _hub_rows(hub_id: str, config: str | None, split: str, unreachable) -> list[dict]:
    """The rows of one hub split; where the hub cannot be read, ``unreachable(why)`` is raised: why offline mode,
    a missing ``datasets`` package or a failed connection stops it."""
    try:
        import datasets
    except ImportError:
        # offline first: with the hub turned off, installing `datasets` would not help
        raise unreachable(_offline() or "the `datasets` package is not installed: pip install datasets") from None
    try:
        table = datasets.load_dataset(hub_id, config, split=split)
    except Exception as e:
        if not _is_connection_error(e):
            raise
        raise unreachable(_offline() or f"no connection: {' '.join(str(e).split())[:160]}") from e
    return [dict(r) for r in table]


def _offline() -> str:
    """``"offline: HF_HUB_OFFLINE=1"`` where the environment turns the hub off, else ""."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").upper() in ("1", "ON", "YES", "TRUE"):
            return f"offline: {var}={os.environ[var]}"
    return ""


# requests', httpx's and huggingface_hub's names for "the hub could not be reached" (not all are OSErrors)
_CONNECTION_ERRORS = {"ConnectionError", "ConnectError", "ConnectTimeout", "ReadTimeout", "Timeout",
                      "OfflineModeIsEnabled", "LocalEntryNotFoundError"}


def _is_connection_error(e: BaseException | None) -> bool:
    """Is ``e``, or what it was raised from, a failure to reach the hub (offline mode included)?"""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        names = {c.__name__ for c in type(e).__mro__}
        if isinstance(e, (ConnectionError, TimeoutError)) or names & _CONNECTION_ERRORS:
            return True
        e = e.__cause__ or e.__context__
    return False


def read_table(src: str, hub: str) -> tuple[list[dict], str]:
    """A training set's rows from the HF hub (``src`` 'hub': ``hub``'s train split; needs `datasets` and a network)
    or a local .parquet / .jsonl file, and a label naming where they came from (for error messages)."""
    if src == "hub":
        rows = _hub_rows(hub, None, "train", lambda why: ConfigError(
            f"{hub} train: the hub is unreachable ({why}); pass --src FILE (a .parquet / .jsonl of {hub})",
            key="--src"))
        return rows, f"hub:{hub}"
    path = Path(src)
    if path.suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict("records"), str(path)
    if path.suffix == ".jsonl":
        return read_jsonl(path), str(path)
    raise ConfigError(f"--src {src}: expected hub, a .parquet or a .jsonl file", key="--src")


def read_jsonl(path: Path) -> list[dict]:
    """One record per non-blank line; a bad line is an error naming the file and line number."""
    records = []
    with Path(path).open() as f:
        for line_no, line in enumerate(f, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
    return records


def make_rows(name: str, split: str, records: list[dict], where: str, template: str = "{question}",
              system: str | None = None, skip_bad: bool = False) -> tuple[list[dict], int]:
    """verl-schema rows from raw records. A bad record raises naming ``where`` and its row (1-based), unless
    ``skip_bad``: then it is skipped and counted."""
    spec = DATASETS[name]
    rows, skipped = [], 0
    for i, rec in enumerate(records):
        try:
            key = next((k for k in spec.question_keys if k in rec), None)
            question = str(rec[key]).strip() if key else ""
            if not question:
                raise ValueError(f"empty or missing question (keys {list(spec.question_keys)})")
            try:
                truth = spec.answer(rec)
            except KeyError as e:
                raise ValueError(f"missing answer key {e}") from None
            if truth is None or str(truth).strip() == "":
                raise ValueError("empty answer")
            content = template.format(question=question, **{k: v for k, v in rec.items() if k != "question"})
        except ValueError as e:
            if skip_bad:
                skipped += 1
                continue
            raise ValueError(f"{where}: row {i + 1}: {e}") from None
        prompt = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
        rows.append({"data_source": spec.data_source, "prompt": prompt, "ability": spec.ability,
                     "reward_model": {"style": "rule", "ground_truth": str(truth)},
                     "extra_info": {"split": split, "index": i, "question": question}})
    return rows, skipped


def write_parquet(rows: list[dict], out: Path) -> None:
    """Atomically: a temp file renamed into place, so an interrupted run never leaves a partial parquet."""
    import pandas as pd

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".parquet.tmp")
    pd.DataFrame(rows).to_parquet(tmp, index=False)
    tmp.replace(out)


def prepare(name: str, src: str | Path | None = None, out: str | Path = "data", splits: list[str] | None = None,
            template: str = "{question}", system: str | None = None, skip_bad: bool = False,
            limit: int | None = None) -> dict[str, Path]:
    """Write ``<out>/<name>/<split>.parquet`` for each split; returns the paths. Prints skipped-row counts.
    ``src``: as ``read_records`` reads it (None: the local copy in ``DEFAULT_SRC`` when there, else the hub)."""
    if name not in DATASETS:
        raise KeyError(f"unknown dataset {name!r}; known: {sorted(DATASETS)}")
    written = {}
    for split in splits or DATASETS[name].splits:
        records, where = read_records(name, split, src)
        rows, skipped = make_rows(name, split, records[:limit] if limit else records, where, template, system, skip_bad)
        path = Path(out) / name / f"{split}.parquet"
        write_parquet(rows, path)
        print(f"{name} {split}: {len(rows)} rows -> {path}" + (f" ({skipped} bad rows skipped)" if skipped else ""))
        written[split] = path
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m core.data.prepare", description=__doc__.split("\n\n")[0])
    p.add_argument("dataset", choices=sorted(DATASETS))
    p.add_argument("--src", default=None, help=SRC_HELP)
    p.add_argument("--out", default="data", help="output folder (parquet goes to <out>/<dataset>/<split>.parquet)")
    p.add_argument("--split", action="append", help="only these splits (repeatable)")
    p.add_argument("--template", default="{question}", help="prompt format string, or @file")
    p.add_argument("--system", default=None, help="optional system message")
    p.add_argument("--skip-bad", action="store_true", help="skip and count bad rows instead of failing")
    p.add_argument("--limit", type=int, default=None, help="first N records per split")
    a = p.parse_args(argv)
    template = Path(a.template[1:]).read_text() if a.template.startswith("@") else a.template
    prepare(a.dataset, a.src, a.out, a.split, template, a.system, a.skip_bad, a.limit)
    return 0


if __name__ == "__main__":
    sys.exit(answer_user_errors(main, sys.argv[1:], prog="python -m core.data.prepare"))
