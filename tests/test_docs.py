"""The documentation: the site builds with ``mkdocs build --strict`` (internal links and anchors checked; external
links are not fetched), the pages generated from the code are the code's, every command the docs show runs with its
documented arguments, every config key they name exists, the metrics page matches a real run both ways, the README
is a front door, and nothing in the product speaks of how it was developed."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core import docgen, metric_keys

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[dev]' (mkdocs-material)")


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"),
                           "-d", str(site)], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_generated_pages_are_what_the_code_gives():
    assert docgen.stale() == [], "regenerate: python -m core.docgen"


def test_the_site_builds_strict_and_has_every_page_of_its_nav(tmp_path):
    run = _build(ROOT, tmp_path / "site")
    assert run.returncode == 0, run.stderr[-3000:]
    pages = [p.relative_to(DOCS) for p in DOCS.rglob("*.md") if not p.name.startswith("_")]  # _template.md
    for page in pages:
        html = tmp_path / "site" / ("index.html" if page.name == "index.md" else page.with_suffix("") / "index.html")
        assert html.is_file(), f"docs/{page} was not built"


@pytest.fixture()
def site_copy(tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(DOCS, root / "docs")
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy(ROOT / name, root / name)
    return root


@pytest.mark.parametrize("bad, named", [("[a page](guide/no-such-page.md)", "guide/no-such-page.md"),
                                        ("[a heading](guide/data.md#no-such-heading)", "no-such-heading")])
def test_a_broken_link_or_anchor_fails_the_build_naming_it(site_copy, tmp_path, bad, named):
    page = site_copy / "docs" / "get-started" / "installation.md"
    page.write_text(page.read_text().replace("# Installation\n", f"# Installation\n\nSee {bad}.\n", 1))
    run = _build(site_copy, tmp_path / "site")
    assert run.returncode != 0 and named in run.stderr, run.stderr[-2000:]


# -- the product speaks of itself only --------------------------------------------------------------------------

HISTORY = re.compile(r"\bsessions?[ -]\d|\bissues?[ -]\d|\blent\b|\bthis[ ]machine\b|\bdev[ ]machine\b", re.I)
TEXT = {".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".txt", ".cfg", ".cff", ".cpp", ".h", ".sbatch", ".json"}


def _product_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True).stdout.split()
    names = {"Makefile", "LICENSE", "run"}
    return [ROOT / p for p in out if (Path(p).suffix in TEXT or Path(p).name in names) and (ROOT / p).is_file()
            and not p.startswith("bench/results/") and p != "tests/test_docs.py"]  # this file: the words it looks for


def test_nothing_in_the_product_speaks_of_how_it_was_developed():
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:120]}" for p in _product_files()
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if HISTORY.search(line)]
    assert not hits, f"{len(hits)} line(s) speak of development history:\n" + "\n".join(hits[:40])


def test_the_history_check_can_fail():
    for text in ("measured in session 8", "Session 13's run", "sessions 21-23", "see issue 22", "issue-7",
                 "the GPU lent to us", "on this machine", "the dev machine"):
        assert HISTORY.search(text), text
    for text in ("a rollout session", "the session API", "excellent", "issues a warning"):
        assert not HISTORY.search(text), text


def test_the_readme_is_a_front_door_that_names_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "make demo" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


# -- every documented command runs with its documented arguments --------------------------------------------------

def documented_commands() -> list[tuple[str, list[str], dict]]:
    """(where, argv, env) of each ``hybridrl ...`` and ``bash recipes/...`` line of a ```bash block in the README and
    the docs (continuation lines joined, comments dropped, leading ``VAR=value`` taken as the environment)."""
    found = []
    for path in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for block in re.findall(r"^```bash\n(.*?)^```", path.read_text(), flags=re.M | re.S):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                env = {}
                while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                    key, _, value = words.pop(0).partition("=")
                    env[key] = value
                if words[:1] == ["hybridrl"] or (words[:1] == ["bash"] and words[1:2] and
                                                 words[1].startswith("recipes/")):
                    found.append((f"{path.relative_to(ROOT)}: {line.strip()}", words, env))
    return found


COMMANDS = documented_commands()
RUN = {"train", "plan"}           # run with --dry-run added: config, data checks and the plan, nothing started
AS_IS = {"recipes", "config"}     # start nothing by themselves: run as written
# the others write, load or start things (a model, Ray, files): their documented arguments are parsed by the verb's
# own parser, which rejects an unknown option or a missing argument


def _parse_only(argv: list[str]) -> None:
    from core import cli, eval as evaluate, export
    from core.verl import run as verl_run

    own = {"eval": evaluate.parser, "export": export.parser, "convert-verl": verl_run.parser}
    if argv[0] in own:
        own[argv[0]]().parse_args(argv[1:])
    else:
        cli.parser().parse_args(argv)


def _main(argv: list[str]) -> tuple[int, str]:
    from core.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
    return rc, out.getvalue()


def test_the_docs_show_commands_of_every_kind():
    assert len(COMMANDS) >= 30
    kinds = {argv[1] if argv[0] == "hybridrl" else "script" for _, argv, _ in COMMANDS}
    assert {"train", "plan", "script", "eval", "new"} <= kinds, kinds


def test_every_documented_command_runs_with_its_documented_arguments(tmp_path, monkeypatch):
    """``hybridrl train/plan`` and each run script with ``--dry-run`` added, in this process (a run script runs
    under bash with a ``PY`` that records the python command it would run; that command then runs here)."""
    monkeypatch.chdir(ROOT)
    record = tmp_path / "py"
    record.write_text('#!/bin/sh\nprintf "%s\\0" "$@" >> "$RECORD"\nprintf "\\n" >> "$RECORD"\n')
    record.chmod(0o755)
    failed, ran = [], 0
    for where, argv, env in COMMANDS:
        if argv[0] == "bash":
            log = tmp_path / f"argv{ran}"
            subprocess.run(["bash", *argv[1:], "--dry-run"], cwd=ROOT, check=True, timeout=60,
                           env={**os.environ, **env, "PY": str(record), "RECORD": str(log)})
            calls = [c.split("\0") for c in log.read_text().split("\0\n") if c] if log.exists() else []
            if not calls or any(c[:2] != ["-m", "core.cli"] for c in calls):
                failed.append(f"{where}: ran {calls} instead of one `python -m core.cli ...`")
                continue
            runs = [c[2:] for c in calls]
        elif argv[1] in RUN:
            runs = [[*argv[1:], "--dry-run"]]
        elif argv[1] in AS_IS:
            runs = [argv[1:]]
        else:
            try:
                _parse_only(argv[1:])
            except SystemExit as e:
                failed.append(f"{where}: its arguments do not parse (exit {e.code})")
            continue
        for args in runs:
            for key, value in env.items():
                monkeypatch.setenv(key, value)
            rc, out = _main(args)
            ran += 1
            if rc != 0:
                failed.append(f"{where}: exit {rc}: {out.strip().splitlines()[-1] if out.strip() else ''}")
            for key in env:
                monkeypatch.delenv(key)
    assert not failed, "\n".join(failed)
    assert ran >= 20


def test_a_documented_command_with_an_unknown_key_fails():
    rc, out = _main(["plan", "grpo", "--config-name", "demo_cpu", "actor.optim.lrr=1e-6", "--dry-run"])
    assert rc == 2 and "did you mean 'lr'" in out


# -- config keys named in the docs exist ------------------------------------------------------------------------

SECTIONS = ("trainer", "data", "placement", "actor", "critic", "rollout", "algo", "reward", "reward_model",
            "implicit_prm", "tools")
KEY = re.compile(r"`((?:%s)\.[a-z_][\w.]*)(?:=[^`]*)?`" % "|".join(SECTIONS))
FILES = re.compile(r"\.(py|yaml|sh|md|json|jsonl|parquet|png|txt)$")


KNOWN_KEYS = docgen.config_keys()  # the config reference's keys: a key a page names is one of those


def _key_exists(key: str) -> bool:
    for known, tp in KNOWN_KEYS.items():
        pattern = re.escape(known).replace("<name>", "[^.]+")
        if re.fullmatch(pattern, key) or (tp.startswith("dict") and re.match(pattern + r"\.", key)):
            return True
    return False


def test_every_config_key_the_docs_name_exists():
    pages = [ROOT / "README.md", *(p for p in DOCS.rglob("*.md") if p.name != "coming-from-verl.md")]
    missing = sorted({f"{p.relative_to(ROOT)}: {m.group(1)}" for p in pages for m in KEY.finditer(p.read_text())
                      if not FILES.search(m.group(1)) and not _key_exists(m.group(1).rstrip("."))})
    assert not missing, "\n".join(missing)
    assert not _key_exists("actor.optim.lrr") and _key_exists("placement.pools.gen.device")


# -- the metrics table against a real run and against core's code -------------------------------------------------

def test_the_metrics_page_and_a_real_runs_keys_agree_both_ways(tmp_path, tiny_model_dir, monkeypatch):
    import json

    from core.scaffold import tiny_data, tiny_overrides

    shutil.copytree(ROOT / "recipes" / "grpo", tmp_path / "grpo", ignore=shutil.ignore_patterns("__pycache__"))
    tiny_data(tmp_path)
    monkeypatch.chdir(tmp_path)
    rc, out = _main(["train", str(tmp_path / "grpo"), *tiny_overrides(tmp_path, tiny_model_dir),
                     f"++data.val_files=[{tmp_path / 'train.parquet'}]", "++data.val_limit=2"])
    assert rc == 0, out[-2000:]
    logged = {k for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
              for k in json.loads(line) if k != "step"}
    undocumented = sorted(k for k in logged if not metric_keys.documented(k))
    assert not undocumented, f"logged but not in core/metric_keys.py: {undocumented}"
    rows = [(key, when) for _, _, section in metric_keys.METRICS for key, when, _ in section]
    every = [key for key, when in rows if when == metric_keys.EVERY_STEP
             and not any(metric_keys.pattern(key).match(k) for k in logged)]
    assert not every, f"core/metric_keys.py says every step, the run did not log: {every}"
    assert any(k.startswith("val/") for k in logged) and len(rows) >= 40


PREFIXES = "reward|response_length|rollout|actor|critic|prm|sync|timing_s|perf|agent|val"
METRIC = re.compile(r"""f?["']((?:%s)/[\w@{}/.]+)["']""" % PREFIXES)


def test_every_metric_key_written_in_core_is_documented():
    """A key a phase of core logs under a new name fails here before a reader misses it (``core/expected.py`` names
    figures derived from metrics, not metrics: left out)."""
    found = {}
    for path in sorted((ROOT / "core").rglob("*.py")):
        if path.name in ("expected.py", "docgen.py", "metric_keys.py"):
            continue
        for m in METRIC.finditer(path.read_text()):
            key = re.sub(r"\{[^}]*\}", "x", m.group(1))
            if not key.endswith("/") and not metric_keys.documented(key):
                found.setdefault(key, path.relative_to(ROOT))
    assert not found, f"metric keys in core's code that core/metric_keys.py does not document: {found}"
    assert not metric_keys.documented("reward/means") and metric_keys.documented("val/openai/gsm8k/pass@1")
