"""Where a dataset is read from when no ``--src`` is given (``core.data.prepare.read_records(name, split, None)``):
the local copy ``DEFAULT_SRC/<name>/<split>.jsonl`` when it exists (``../shared/data`` beside the checkout, or the
folder ``HYBRIDRL_DATA_SRC`` names), else the Hugging Face hub -- and where neither can be read, one line naming the
dataset, the split, the file looked for and ``--src``. The hub is never reached here: every test runs offline."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import core.data.prepare as prepare_mod
from core.config.errors import ConfigError
from core.data.prepare import prepare, read_records

ROOT = Path(__file__).resolve().parents[2]
ROWS = [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
        {"question": "What is 6 times 7?", "answer": "6 * 7 = 42\n#### 42"}]


def unreachable(src: Path) -> str:
    return (f"gsm8k test: no local copy at {src / 'gsm8k' / 'test.jsonl'} and the hub is unreachable (offline: "
            "HF_HUB_OFFLINE=1); pass --src DIR holding gsm8k/test.jsonl")


@pytest.fixture
def offline(monkeypatch):
    """The hub off, as HF_HUB_OFFLINE=1 at start-up turns it off (the HF libraries read it once, at import)."""
    datasets = pytest.importorskip("datasets")
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture
def empty_default(tmp_path, monkeypatch) -> Path:
    """DEFAULT_SRC pointed at an empty folder: no local copy of anything."""
    src = tmp_path / "shared_data"
    src.mkdir()
    monkeypatch.setattr(prepare_mod, "DEFAULT_SRC", src)
    return src


def test_no_local_copy_and_the_hub_offline_is_one_line_naming_the_file_and_src(empty_default, offline, tmp_path):
    with pytest.raises(ConfigError) as e:
        read_records("gsm8k", "test", None)
    assert str(e.value) == unreachable(empty_default) and e.value.key == "--src"
    with pytest.raises(ConfigError, match="pass --src DIR holding gsm8k/test.jsonl"):  # prepare's default too
        prepare("gsm8k", out=tmp_path / "out", splits=["test"])
    assert not (tmp_path / "out").exists()


def test_without_the_datasets_package_the_error_says_so(empty_default, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError
    with pytest.raises(ConfigError) as e:
        read_records("aime24", "test")
    assert str(e.value) == (f"aime24 test: no local copy at {empty_default / 'aime24' / 'test.jsonl'} and the hub is "
                            "unreachable (the `datasets` package is not installed: pip install datasets); pass --src "
                            "DIR holding aime24/test.jsonl")


def test_an_explicit_folder_or_hub_is_read_alone(tmp_path, offline):
    """``--src DIR``: that folder only (no fallback to the hub); ``--src hub``: the hub only."""
    with pytest.raises(ConfigError) as e:
        read_records("gsm8k", "test", tmp_path)
    assert str(e.value) == (f"gsm8k test: no file {tmp_path / 'gsm8k' / 'test.jsonl'} (pass --src DIR holding "
                            "gsm8k/test.jsonl, or --src hub)")
    with pytest.raises(ConfigError) as e:
        read_records("gsm8k", "test", "hub")
    assert str(e.value) == ("gsm8k test: the hub is unreachable (offline: HF_HUB_OFFLINE=1); pass --src DIR holding "
                            "gsm8k/test.jsonl")


def test_the_local_copy_is_the_default_when_it_is_there(empty_default, offline, tmp_path):
    path = empty_default / "gsm8k" / "test.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    records, where = read_records("gsm8k", "test")
    assert records == ROWS and where == str(path)
    df = pd.read_parquet(prepare("gsm8k", out=tmp_path / "out", splits=["test"])["test"])
    assert [r["ground_truth"] for r in df["reward_model"]] == ["7", "42"]


def test_eval_reads_the_default_local_copy(empty_default, offline, tiny_model_dir, capsys):
    from core.cli import main

    path = empty_default / "gsm8k" / "test.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert main(["eval", "--model", str(tiny_model_dir), "--data", "gsm8k", "--max-new-tokens", "2",
                 "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "| 2 problems x n=1 |" in out and "| openai/gsm8k | 2 | 2 |" in out, out


def test_eval_without_data_is_one_line_on_stderr_and_no_traceback(tmp_path):
    """A real ``hybridrl eval`` where the default folder (HYBRIDRL_DATA_SRC) is empty and the hub is off: exit 2,
    one line naming the file looked for and --src; the data is read before any model, so the model is never
    looked up."""
    env = os.environ | {"HYBRIDRL_DATA_SRC": str(tmp_path), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.pop("HYBRIDRL_DEBUG", None)
    r = subprocess.run([sys.executable, "-m", "core.cli", "eval", "--model", "no-such-model", "--data", "gsm8k",
                        "--limit", "2"], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr == ("hybridrl: gsm8k test: no local copy at " f"{tmp_path / 'gsm8k' / 'test.jsonl'} and the hub "
                        "is unreachable (offline: HF_HUB_OFFLINE=1); pass --src DIR holding gsm8k/test.jsonl\n")


def test_eval_help_says_what_the_default_src_is(capsys):
    from core.cli import main

    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert ("(default: ../shared/data beside the checkout when it holds the dataset, else the Hugging Face hub "
            "(needs `datasets` and a network)); HYBRIDRL_DATA_SRC=DIR") in text, text


def test_an_unknown_dataset_name_is_one_line(capsys):
    from core.cli import main

    assert main(["eval", "--model", "m", "--data", "gsm9k"]) == 2
    assert capsys.readouterr().err == ("hybridrl: --data gsm9k: neither a dataset name (aime24, amc23, gsm8k, math, "
                                       "minerva_math) nor a .parquet file; did you mean 'gsm8k'?\n")
