"""Model resolution: clear errors naming where it looked, and a one-time conversion that racing ranks share."""

import multiprocessing as mp
import time
from pathlib import Path

import pytest

from core.models import ModelNotFoundError, build_once, resolve_model


def slow_build(target: Path) -> Path:
    """A stand-in conversion: counts its runs, takes a while, leaves a model folder."""
    with open(target.parent / "builds.log", "a") as f:
        f.write("built\n")
    time.sleep(0.5)
    target.mkdir()
    (target / "config.json").write_text("{}")
    return target


def race(target: str, out: mp.Queue) -> None:
    out.put(str(build_once(Path(target), slow_build)))


def test_racing_processes_build_the_model_folder_once(tmp_path):
    target = tmp_path / "models" / "m"
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=race, args=(str(target), q)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert sorted(q.get() for _ in procs) == [str(target)] * 3
    assert (tmp_path / "models" / "builds.log").read_text() == "built\n"
    assert build_once(target, slow_build) == target  # already there: no second build
    assert (tmp_path / "models" / "builds.log").read_text() == "built\n"


def test_a_missing_model_names_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDRL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelNotFoundError, match=r"model 'no-such-model' not found; looked in: no-such-model, "
                                                 + str(tmp_path / "cache" / "models" / "no-such-model")):
        resolve_model("no-such-model")
